// AXLearn's own Checkpointer restores the converted checkpoints. The only `axlearn` on PyPI is a February 2024
// snapshot; its wheel is downloaded once (pip download, cached in the OS temp dir, never installed) and imported
// from the zip with a few shims for what moved in jax and for tensorflow/flax, which are not installed (see
// test/python/axlearn_pypi_restore.py). Without network access to PyPI these tests are skipped.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { axlearnPypiRestore, convertWith, FIXTURE_CASES, type RestoreSummary, removeScratch, SAMPLE, scratch } from "../helpers/convert.js";
import { PYTHON } from "../helpers/paths.js";

afterAll(removeScratch);

const AXLEARN = "axlearn==0.0.1.post20240213000026";
const ATTRS = "attrs==26.1.0";
const WHEELS = join(tmpdir(), "orbax2reg-axlearn-pypi-20240213");

/** The two wheels, downloaded once; a reason string when they cannot be had. */
function wheels(): string | undefined {
  const have = () => existsSync(WHEELS) && readdirSync(WHEELS).filter((f) => f.endsWith(".whl")).length >= 2;
  if (have()) return undefined;
  mkdirSync(WHEELS, { recursive: true });
  const pip = join(PYTHON, "..", "pip");
  const r = spawnSync(pip, ["download", "--no-deps", "--only-binary", ":all:", "-d", WHEELS, AXLEARN, ATTRS], {
    encoding: "utf8",
    timeout: 180_000,
  });
  return have() ? undefined : `pip download failed: ${(r.stderr ?? "").slice(-500)}`;
}

const out = scratch("axlearn-pypi");
let unavailable: string | undefined;
let results = new Map<string, RestoreSummary>();

beforeAll(async () => {
  unavailable = wheels();
  if (unavailable !== undefined) return;
  for (const c of FIXTURE_CASES) await convertWith(c.location, join(out, c.id), c.step === undefined ? {} : { step: c.step });
  results = axlearnPypiRestore(
    [
      { name: "axlearn-sample", root: join(SAMPLE, ".."), step: 100 },
      ...FIXTURE_CASES.map((c) => ({ name: c.id, root: join(out, c.id), step: Number(c.stepDir.slice(-8)), source_item: c.item })),
    ],
    WHEELS,
  );
}, 600_000);

describe("AXLearn's Checkpointer.restore from the PyPI axlearn wheel (2024 snapshot)", () => {
  test("restores AXLearn's own sample checkpoint (a control for the harness)", (ctx) => {
    if (unavailable !== undefined) ctx.skip();
    const r = results.get("axlearn-sample");
    expect(r?.problems).toEqual([]);
    expect(r).toMatchObject({ step: 100, arrays: 4, small: { "learner/optimizer/count": 42, prng_key: [0, 42, 7, 0xdeadbeef] } });
  });

  test.for(FIXTURE_CASES)("restores the conversion of $label, every array bit-exact", (c, ctx) => {
    if (unavailable !== undefined) ctx.skip();
    const r = results.get(c.id);
    expect(r?.problems).toEqual([]);
    expect(r?.step).toBe(Number(c.stepDir.slice(-8)));
    expect(r?.arrays).toBeGreaterThan(0);
    expect(r?.matched).toBe(r?.arrays);
    // EXACT unless the index also lists an input iterator, which a state of arrays alone cannot match.
    expect(r?.validation).toBe(c.id === "iterators" || c.id === "emergency" ? "CONTAINS_STATE" : "EXACT");
  });
});
