// `orbax2reg cloud check` with hf_export (src/cloud/ops/check-export.ts): an export-only run of the bundled fuji example
// into the folder hf_export's template gives under the check's root, checked byte for byte against the export the same
// engine makes here, then removed. On fake-gcs-server, with the workflow played by a stand-in that makes the export with
// the engine the jobs run (exportHf) when started: what is checked is the check's side (the run it asks for, what it
// uploads, compares and removes), not the pipeline's, which test/workflows/export.test.ts runs on the Workflows emulator.
import { describe, expect, test } from "vitest";
import { type ExecutionRef, type Executions, rootLabel, type WorkflowArgument } from "../../../src/cloud/api/executions.js";
import { type CheckReport, postDeployCheck, type Stage } from "../../../src/cloud/ops/check.js";
import { EXPORT_MAX_SHARD_SIZE } from "../../../src/cloud/ops/check-export.js";
import type { VerifyResult } from "../../../src/convert/verify.js";
import { DEFAULT_EXPORT_MEMORY, exportHf } from "../../../src/hf/export.js";
import { GcsStore } from "../../../src/store/gcs.js";
import { openStore } from "../../../src/store/open.js";
import { emulatorStorage, newBucket } from "../../helpers/gcs.js";

const WORKFLOW = "projects/p/locations/us-central1/workflows/orbax2reg-convert";

interface Started {
  readonly argument: WorkflowArgument;
  readonly labels: Record<string, string>;
  /** Object names under the fuji step when the run was started. */
  readonly sourceObjects: string[];
}

/**
 * A Workflows stand-in: the conversion check's execution appears once its step is uploaded (as the trigger would start
 * it); an execution started by the check makes the export with exportHf, then `tamper` may change what it wrote.
 */
function pipeline(bucket: string, tamper: (exportTo: string) => Promise<void> = async () => {}) {
  const executions: ExecutionRef[] = [];
  const started: Started[] = [];
  let checkRoot: string | undefined;
  const matches = (e: ExecutionRef, labels: Record<string, string>) => Object.entries(labels).every(([k, v]) => e.labels[k] === v);
  const fake: Executions = {
    start: async (_workflow, argument, labels) => {
      const [objects] = await emulatorStorage()
        .bucket(bucket)
        .getFiles({ prefix: `${argument.source.slice(`gs://${bucket}/`.length)}/` });
      started.push({ argument, labels, sourceObjects: objects.map((o) => o.name) });
      const e = argument.export as NonNullable<WorkflowArgument["export"]>;
      await exportHf(argument.source, e.destination, {
        memoryBytes: DEFAULT_EXPORT_MEMORY,
        maxShardSize: Number(e.max_shard_size),
        ...(e.dtype === undefined ? {} : { dtype: e.dtype }),
      });
      // A progress record in the step's work directory of the regular root, as the export jobs leave one.
      await (await openStore(`${argument.destination}/step_00001000`)).write(".orbax2reg/progress/export-begin.json", new Uint8Array(2));
      await tamper(e.destination);
      const name = `${WORKFLOW}/executions/export-${executions.length}`;
      executions.push({ name, state: "SUCCEEDED", argument: JSON.stringify(argument), labels, startTime: new Date().toISOString() });
      return name;
    },
    find: async (_workflow, labels, options) => {
      if (checkRoot !== undefined && labels.step === "100" && !executions.some((e) => e.labels.step === "100"))
        executions.push({
          name: `${WORKFLOW}/executions/convert`,
          state: "SUCCEEDED",
          argument: JSON.stringify({
            source: `gs://${bucket}/${checkRoot}/step_00000100`,
            destination: `gs://${bucket}/${checkRoot}/regular`,
          }),
          labels: { step: "100", source: rootLabel(`gs://${bucket}/${checkRoot}`) },
          startTime: new Date().toISOString(),
        });
      // startTime stands for createTime here: both are now.
      return executions.filter((e) => matches(e, labels) && !((e.startTime ?? "") < (options?.createdSince ?? "")));
    },
    findFull: async (_workflow, labels) => executions.filter((e) => matches(e, labels)),
    get: async (name) => {
      const e = executions.find((x) => x.name === name);
      if (e === undefined) throw new Error(`no execution ${name}`);
      return e;
    },
    cancel: async () => {
      throw new Error("not called");
    },
  };
  return {
    executions: fake,
    started,
    sawUpload: (location: string) => {
      const m = new RegExp(`^gs://${bucket}/(.+)/step_00000100$`).exec(location);
      if (m) checkRoot = m[1];
    },
  };
}

async function check(exportTemplate: string | undefined, tamper?: (exportTo: string) => Promise<void>) {
  const bucket = await newBucket("check-export");
  const p = pipeline(bucket, tamper);
  const stages: Stage[] = [];
  const report: CheckReport = await postDeployCheck(
    {
      bucket,
      prefix: "runs",
      workflow: WORKFLOW,
      eventsTopic: undefined,
      keep: false,
      triggerTimeoutMs: 5_000,
      convertTimeoutMs: 5_000,
      pollMs: 1,
      destinationTemplate: "gs://{bucket}/{root}/regular",
      ...(exportTemplate === undefined ? {} : { exportTemplate }),
    },
    {
      executions: p.executions,
      openStore: async (location) => {
        p.sawUpload(location);
        return openStore(location);
      },
      uniformAccess: async (b) => new GcsStore(b, "", undefined, emulatorStorage()).uniformBucketLevelAccess(),
      subscribe: async () => {
        throw new Error("not called");
      },
      verify: async (): Promise<VerifyResult> => ({ checks: [{ name: "stand-in", ok: true }], passed: 1, failed: 0 }) as VerifyResult,
      onStage: (s) => stages.push(s),
    },
  );
  const [left] = await emulatorStorage().bucket(bucket).getFiles();
  return { bucket, report, stages, started: p.started, left: left.map((f) => f.name) };
}

describe("cloud check with hf_export", () => {
  test("runs an export-only run of the fuji example into hf_export's folder for its root, export-hf's bytes, and removes it all", async () => {
    const { bucket, report, stages, started, left } = await check("gs://{bucket}/{root}/hf/{step}");
    expect(stages.map((s) => [s.stage, s.ok])).toEqual([
      ["access", true],
      ["upload", true],
      ["trigger", true],
      ["filter", true],
      ["convert", true],
      ["verify", true],
      ["layout", true],
      ["export", true],
      ["export-verify", true],
      ["cleanup", true],
    ]);
    expect(report.ok).toBe(true);
    const root = /^gs:\/\/[^/]+\/(runs\/orbax2reg-check-[0-9a-f]{8})\//.exec(report.source)?.[1];
    expect(started).toHaveLength(1);
    expect(started[0]?.argument).toEqual({
      source: `gs://${bucket}/${root}/step_00001000`,
      destination: `gs://${bucket}/${root}/regular`,
      step: 1000,
      groups: 1,
      convert: false,
      export: {
        destination: `gs://${bucket}/${root}/hf/step_00001000`,
        dtype: "bfloat16",
        max_shard_size: EXPORT_MAX_SHARD_SIZE,
        tasks: 2,
      },
    });
    expect(started[0]?.labels).toEqual({ step: "1000", source: rootLabel(`gs://${bucket}/${root}`) });
    expect(stages.find((s) => s.stage === "export-verify")?.detail).toMatch(
      /^\d+ files \(\d+ shards\), \d+ bytes: byte for byte export-hf's of the same example$/,
    );
    expect(left).toEqual([]);
  }, 120_000);

  test("an export folder outside the check's root (hf_export's own tree) is removed too, and nothing else there", async () => {
    const { report, stages, left } = await check("gs://{bucket}/exports/{root}/{step}");
    expect(report.ok).toBe(true);
    expect(stages.find((s) => s.stage === "export")?.detail).toMatch(
      /into gs:\/\/[^/]+\/exports\/runs\/orbax2reg-check-[0-9a-f]{8}\/step_00001000$/,
    );
    expect(left).toEqual([]);
  }, 120_000);

  test("uploads the fuji step without a commit marker: nothing the trigger would start a conversion for", async () => {
    const { started } = await check("gs://{bucket}/{root}/hf/{step}");
    expect(started[0]?.sourceObjects.length).toBeGreaterThan(5);
    expect(started[0]?.sourceObjects.filter((n) => n.endsWith("commit_success.txt"))).toEqual([]);
  }, 120_000);

  test("an export whose shard is not export-hf's bytes fails export-verify naming the shard, and is removed all the same", async () => {
    const { report, stages, left } = await check("gs://{bucket}/{root}/hf/{step}", async (exportTo) => {
      const store = await openStore(exportTo);
      const shards: string[] = [];
      for await (const f of store.list("model-0")) shards.push(f.key);
      const shard = shards[0] as string;
      const bytes = await store.read(shard);
      bytes[0] = (bytes[0] as number) ^ 1;
      await store.write(shard, bytes);
    });
    expect(report.ok).toBe(false);
    const failed = stages.find((s) => s.stage === "export-verify");
    expect(failed?.ok).toBe(false);
    expect(failed?.detail).toMatch(/\/hf\/step_00001000\/model-00001-of-0000\d\.safetensors: not the bytes export-hf writes here/);
    expect(stages.at(-1)).toMatchObject({ stage: "cleanup", ok: true });
    expect(left).toEqual([]);
  }, 120_000);

  test("a template that puts the export in the step itself fails the export stage, before anything is started", async () => {
    const { report, stages, started, left } = await check("gs://{bucket}/{root}/{step}");
    expect(report.ok).toBe(false);
    expect(stages.slice(-2).map((s) => [s.stage, s.ok])).toEqual([
      ["export", false],
      ["cleanup", true],
    ]);
    expect(stages.at(-2)?.detail).toMatch(/export\.destination .* is inside the source .*: nothing is written into a source/);
    expect(started).toEqual([]);
    expect(left).toEqual([]);
  }, 120_000);

  test("without hf_export the export stage is skipped, saying why, and the check passes", async () => {
    const { report, stages, started } = await check(undefined);
    expect(stages.find((s) => s.stage === "export")).toMatchObject({
      ok: true,
      skipped: true,
      detail: expect.stringMatching(/hf_export is off/),
    });
    expect(stages.some((s) => s.stage === "export-verify")).toBe(false);
    expect(started).toEqual([]);
    expect(report.ok).toBe(true);
  }, 120_000);
});
