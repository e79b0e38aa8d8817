import { existsSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { jsonLogger } from "../../../src/cloud/api/log.js";
import { exportRetentionFromEnv, pruneExports } from "../../../src/cloud/job/export-retention.js";
import { INDEX_NAME } from "../../../src/hf/shards.js";
import { tempDir } from "../../helpers/tmp.js";

// The exports' own retention (terraform hf_export.keep_last_n / keep_every_n_steps): after export-finalize commits a
// step's export, the committed exports beside it that AXLearn's rule drops are deleted, never the one just written.

const log = jsonLogger({}, () => {});

/** A folder of step_ exports: `committed` with an index and a shard, `uncommitted` with a shard only. */
function exportsFolder(committed: number[], uncommitted: number[] = []): string {
  const root = join(tempDir("hf-retention"), "hf");
  for (const step of [...committed, ...uncommitted]) {
    const dir = join(root, `step_${String(step).padStart(8, "0")}`);
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "model-00001-of-00001.safetensors"), "x");
    if (committed.includes(step)) writeFileSync(join(dir, INDEX_NAME), "{}");
  }
  return root;
}
const left = (root: string) => readdirSync(root).sort();

describe("the exports' retention", () => {
  test("keep_last_n keeps the newest committed exports and deletes the older ones whole", async () => {
    const root = exportsFolder([1000, 2000, 3000, 4000]);
    expect(await pruneExports({ keepLastN: 2, keepEveryNSteps: null }, `${root}/step_00004000`, 4000, log)).toEqual([1000, 2000]);
    expect(left(root).filter((d) => existsSync(join(root, d, INDEX_NAME)))).toEqual(["step_00003000", "step_00004000"]);
    expect(readdirSync(join(root, "step_00001000"), { recursive: true }).filter((f) => String(f).includes("."))).toEqual([]);
  });

  test("uncommitted exports (another export still writing) are neither counted nor deleted", async () => {
    const root = exportsFolder([1000, 2000], [3000]);
    expect(await pruneExports({ keepLastN: 1, keepEveryNSteps: null }, `${root}/step_00002000`, 2000, log)).toEqual([1000]);
    expect(existsSync(join(root, "step_00003000", "model-00001-of-00001.safetensors"))).toBe(true);
  });

  test("with no rule set nothing is listed or deleted", async () => {
    const root = exportsFolder([1000, 2000]);
    expect(await pruneExports({ keepLastN: null, keepEveryNSteps: null }, `${root}/step_00002000`, 2000, log)).toEqual([]);
    expect(left(root)).toEqual(["step_00001000", "step_00002000"]);
  });

  test("an export folder not named step_XXXXXXXX has no siblings to compare: nothing is deleted", async () => {
    const root = exportsFolder([1000, 2000]);
    expect(await pruneExports({ keepLastN: 1, keepEveryNSteps: null }, `${root}`, 2000, log)).toEqual([]);
    expect(left(root)).toEqual(["step_00001000", "step_00002000"]);
  });

  test("the rules come from ORBAX2REG_EXPORT_KEEP_LAST_N and ORBAX2REG_EXPORT_KEEP_EVERY_N_STEPS; 0 or unset is off", () => {
    expect(exportRetentionFromEnv({ ORBAX2REG_EXPORT_KEEP_LAST_N: "3" })).toEqual({ keepLastN: 3, keepEveryNSteps: null });
    expect(exportRetentionFromEnv({ ORBAX2REG_EXPORT_KEEP_EVERY_N_STEPS: "0" })).toEqual({ keepLastN: null, keepEveryNSteps: null });
  });
});
