// `orbax2reg cloud check` (src/cloud/ops/check.ts) removes what it wrote, also when a stage fails. Each delete names the
// generation it listed (ifGenerationMatch): Google counts a delete idempotent, so safe to retry, only with such a
// precondition (https://cloud.google.com/storage/docs/retry-strategy). fake-gcs-server ignores the precondition on
// DELETE, so what is checked is that every delete asks for it.
import { describe, expect, test } from "vitest";
import type { Executions } from "../../../src/cloud/api/executions.js";
import { postDeployCheck, type Stage } from "../../../src/cloud/ops/check.js";
import { GcsStore } from "../../../src/store/gcs.js";
import { openStore } from "../../../src/store/open.js";
import { type WatchedDeletes, watchDeletes } from "../../helpers/deletes.js";
import { emulatorStorage, newBucket } from "../../helpers/gcs.js";

describe("cloud check's clean-up", () => {
  test("deletes the uploaded checkpoint after a failed stage, each object at the generation listed", async () => {
    const bucket = await newBucket("check");
    const gcs: WatchedDeletes[] = [];
    const stages: Stage[] = [];
    const noExecution: Executions = {
      start: async () => "",
      find: async () => [],
      findFull: async () => [],
      get: async () => {
        throw new Error("not called");
      },
      cancel: async () => {
        throw new Error("not called");
      },
    };
    const report = await postDeployCheck(
      { bucket, prefix: "runs", workflow: "w", eventsTopic: undefined, keep: false, triggerTimeoutMs: 0, convertTimeoutMs: 0, pollMs: 1 },
      {
        executions: noExecution,
        openStore: async (location) => {
          if (!location.startsWith("gs://")) return openStore(location);
          const w = watchDeletes(await openStore(location));
          gcs.push(w);
          return w.store;
        },
        uniformAccess: async (b) => new GcsStore(b, "", undefined, emulatorStorage()).uniformBucketLevelAccess(),
        subscribe: async () => {
          throw new Error("not called");
        },
        verify: async () => {
          throw new Error("not called");
        },
        onStage: (s) => stages.push(s),
      },
    );
    expect(report.ok).toBe(false);
    expect(stages.map((s) => [s.stage, s.ok])).toEqual([
      ["access", true], // fake-gcs-server's bucket resource has no iamConfiguration: not known, said so
      ["upload", true],
      ["trigger", false],
      ["cleanup", true],
    ]);
    expect(gcs.flatMap((w) => w.plain)).toEqual([]);
    const asked = gcs.flatMap((w) => w.versioned);
    expect(asked.length).toBeGreaterThan(10);
    expect(asked.every(([, generation]) => /^[0-9]+$/.test(generation))).toBe(true);
    const [left] = await emulatorStorage().bucket(bucket).getFiles({ prefix: "runs/" });
    expect(left).toEqual([]);
  });
});
