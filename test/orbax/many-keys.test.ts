// A step's keys are streamed, not held: a database padded with a million keys that no array's grid has costs
// the CLI time to list, never memory in proportion. Each command runs as the installed CLI does (the shebang's
// runtime) in a child process that reports its peak RSS (the kernel's VmHWM) on exit: test/helpers/peak-rss.ts.
// Holding the keys took inspect to 525 MiB and convert to 747 MiB; streamed, both stay within a few tens of MiB of
// what they take on the same step unpadded. The bound is wide (+128 MiB), so that only memory that
// grows with the key count fails it, not a loaded machine's garbage collector.
import { readFileSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { fixtureCase } from "../helpers/convert.js";
import { stepWithExtraKeys } from "../helpers/many-keys.js";
import { runWithPeakRss } from "../helpers/peak-rss.js";
import { tempDir } from "../helpers/tmp.js";

const EXTRA_KEYS = 1_000_000;
const MARGIN_MIB = 128;

/** Runs the CLI as installed; its exit code, stdout and peak RSS in MiB. */
function peak(args: string[]): { code: number | null; stdout: string; peakMiB: number } {
  return runWithPeakRss(["bin/orbax2reg.js", ...args], { timeoutMs: 120_000 });
}

describe("a step whose database holds a million keys outside every array's grid", () => {
  const original = fixtureCase("tiny").location;
  let padded = "";
  beforeAll(async () => {
    padded = await stepWithExtraKeys(original, EXTRA_KEYS);
  }, 180_000);
  // The padded copy is 15 MB.
  afterAll(() => rmSync(dirname(padded), { recursive: true, force: true }));

  test("inspect lists the same arrays in about the memory the step takes unpadded", () => {
    const base = peak(["inspect", "--json", original]);
    const r = peak(["inspect", "--json", padded]);
    expect(r.code).toBe(0);
    // The copy's values are all inline (stepWithExtraKeys): the same arrays, stored otherwise.
    const arrays = (out: string) => JSON.parse(out).arrays.map(({ storage: _, ...a }: { storage: string }) => a);
    expect(arrays(r.stdout)).toEqual(arrays(base.stdout));
    expect(r.peakMiB).toBeLessThan(base.peakMiB + MARGIN_MIB);
  }, 120_000);

  test("convert writes the same index, and verify passes it, each in about the memory the step takes unpadded", () => {
    const [a, b] = [tempDir("keys-base"), tempDir("keys-padded")];
    const base = peak(["convert", original, a]);
    const r = peak(["convert", padded, b]);
    expect(r.code).toBe(0);
    const index = (root: string) => readFileSync(join(root, "step_00000100", "index"), "utf8");
    expect(index(b)).toBe(index(a));
    expect(r.peakMiB).toBeLessThan(base.peakMiB + MARGIN_MIB);

    // verify, of the padded step against what convert made of it, as of the unpadded one against its own.
    const verifyBase = peak(["verify", original, join(a, "step_00000100"), "--no-progress"]);
    const verified = peak(["verify", padded, join(b, "step_00000100"), "--no-progress"]);
    expect(verified.code, verified.stdout).toBe(0);
    expect(verified.peakMiB).toBeLessThan(verifyBase.peakMiB + MARGIN_MIB);
  }, 120_000);
});
