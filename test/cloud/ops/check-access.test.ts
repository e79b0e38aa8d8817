// `orbax2reg cloud check` first checks uniform bucket-level access on the checkpoint bucket: the function's claim grant
// and the jobs' write grant are IAM conditions, which Cloud Storage honours only on buckets that have it
// (https://cloud.google.com/storage/docs/uniform-bucket-level-access). Read from the bucket resource's
// iamConfiguration.uniformBucketLevelAccess.enabled on Google's storage-testbench, which keeps that setting as Cloud
// Storage does (fake-gcs-server has no iamConfiguration at all: there the check says it cannot tell).

import { randomBytes } from "node:crypto";
import { describe, expect, test } from "vitest";
import type { Executions } from "../../../src/cloud/api/executions.js";
import { postDeployCheck, type Stage } from "../../../src/cloud/ops/check.js";
import { GcsStore } from "../../../src/store/gcs.js";
import { openStore } from "../../../src/store/open.js";
import { testbenchMissing, testbenchStorage } from "../../helpers/testbench.js";

const missing = testbenchMissing();

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

async function check(uniform: boolean): Promise<Stage[]> {
  const bucket = `access-${randomBytes(6).toString("hex")}`;
  await testbenchStorage().createBucket(bucket, { iamConfiguration: { uniformBucketLevelAccess: { enabled: uniform } } });
  const stages: Stage[] = [];
  await postDeployCheck(
    { bucket, prefix: "runs", workflow: "w", eventsTopic: undefined, keep: false, triggerTimeoutMs: 0, convertTimeoutMs: 0, pollMs: 1 },
    {
      executions: noExecution,
      openStore: async (location) =>
        location.startsWith("gs://")
          ? new GcsStore(bucket, location.slice(`gs://${bucket}/`.length), undefined, testbenchStorage())
          : openStore(location),
      uniformAccess: async (b) => new GcsStore(b, "", undefined, testbenchStorage()).uniformBucketLevelAccess(),
      subscribe: async () => {
        throw new Error("not called");
      },
      verify: async () => {
        throw new Error("not called");
      },
      onStage: (s) => stages.push(s),
    },
  );
  return stages;
}

describe.skipIf(missing !== undefined)(`cloud check's access stage, on storage-testbench${missing ? ` (${missing})` : ""}`, () => {
  test("a bucket with uniform bucket-level access passes, and the check goes on", async () => {
    const stages = await check(true);
    expect(stages[0]).toMatchObject({ stage: "access", ok: true, detail: expect.stringMatching(/uniform bucket-level access enabled/) });
    expect(stages[1]?.stage).toBe("upload");
  });

  test("a bucket without it fails the check at once, in one line saying why and how to enable it", async () => {
    const stages = await check(false);
    expect(stages.map((s) => [s.stage, s.ok])).toEqual([
      ["access", false],
      ["cleanup", true],
    ]);
    expect(stages[0]?.detail).toMatch(/has no uniform bucket-level access: .*IAM conditions.*--uniform-bucket-level-access/);
  });
});
