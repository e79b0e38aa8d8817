// export-hf --step: under a checkpoint root, the step asked for instead of the latest, as convert and inspect
// take it; given a step directory, --step can only agree with it.
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { runCli } from "../helpers/cli.js";
import { tempDir } from "../helpers/tmp.js";
import { fujiArrays, writeRegularStep } from "./fuji-tree.js";

const DIMS = { layers: 2, dim: 32, heads: 4, kvHeads: 2, headDim: 8, ffn: 48, vocab: 40 };

/** A root of regular steps 7 and 9, with different weights. */
function root(): string {
  const dir = tempDir("hf-step");
  writeRegularStep(join(dir, "step_00000007"), fujiArrays(DIMS, 7), (a) => [...a.shape], 7);
  writeRegularStep(join(dir, "step_00000009"), fujiArrays(DIMS, 9), (a) => [...a.shape], 9);
  return dir;
}

describe("export-hf --step", () => {
  test("under a root, exports the step given, not the latest", async () => {
    const dir = root();
    const latest = await runCli(["export-hf", dir, join(dir, "hf-latest"), "--json", "--no-progress"]);
    expect(latest.code, latest.stderr).toBe(0);
    expect(JSON.parse(latest.stdout).step).toBe(9);
    const r = await runCli(["export-hf", dir, join(dir, "hf-7"), "--step", "7", "--json", "--no-progress"]);
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ step: 7, stepChosenBy: "given" });
  });

  test("a step the root does not have is refused in one line naming the steps there", async () => {
    const dir = root();
    const r = await runCli(["export-hf", dir, join(dir, "hf"), "--step", "8", "--no-progress"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/: no step 8 \(steps here: 7, 9\)\n$/);
  });

  test("with a step directory, another step is refused", async () => {
    const dir = root();
    const r = await runCli(["export-hf", join(dir, "step_00000007"), join(dir, "hf"), "--step", "9", "--no-progress"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(
      /step_00000007: is the directory of step 7, not of step 9 \(--step chooses a step under a checkpoint root\)\n$/,
    );
  });
});
