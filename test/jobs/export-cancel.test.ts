import { existsSync, rmSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { runJob } from "../../jobs/main.js";
import { jsonLogger } from "../../src/cloud/api/log.js";
import { cancelMarkerKey, RUN_EXPORT_KEY, RUN_PLAN_KEY, type RunPlan, runDirKey } from "../../src/convert/work-dir.js";
import { CancelledError } from "../../src/errors.js";
import { beginExport, DEFAULT_EXPORT_MEMORY, exportShards, finalizeExport } from "../../src/hf/export.js";
import { INDEX_NAME } from "../../src/hf/shards.js";
import { removeScratch, scratch } from "../helpers/convert.js";
import { moduleDashboard } from "../helpers/dashboard-json.js";
import { emulatorStorage, newBucket, uploadDir } from "../helpers/gcs.js";

// `orbax2reg cloud cancel` of an export: the marker it leaves in the step's work directory stops every export job
// as it starts, and export-finalize looks again once it has checked the shards, before it writes anything.
// The export jobs run in this process against fake-gcs-server, with the environment the plan job answers.

const EXAMPLE = "test/fixtures/orbax-axlearn/fuji-v2-tiny/step_00001000";
const EXECUTION = "projects/p/locations/us-central1/workflows/orbax2reg-convert/executions/wf1";

afterAll(removeScratch);

/** The example's step in a bucket, planned export-only (1 kB shards: 8 of them, in 2 tasks). */
async function exportRun() {
  const bucket = await newBucket("xcancel");
  await uploadDir(EXAMPLE, bucket, "runs/exp/step_00001000");
  const dest = `gs://${bucket}/runs/exp/regular`;
  const folder = "runs/exp/hf/step_00001000";
  const lines: Record<string, unknown>[] = [];
  const log = () => jsonLogger({}, (l) => lines.push(JSON.parse(l)));
  const base = { ORBAX2REG_DESTINATION: dest, ORBAX2REG_EXECUTION: EXECUTION, ORBAX2REG_RUN: `${dest}/${runDirKey("wf1")}` };
  const argument = {
    source: `gs://${bucket}/runs/exp/step_00001000`,
    destination: dest,
    convert: false,
    export: { destination: `gs://${bucket}/${folder}`, max_shard_size: 1000, tasks: 2 },
  };
  expect(await runJob("plan", { ...base, ORBAX2REG_ARGUMENT: JSON.stringify(argument), ORBAX2REG_ATTEMPT: "p1" }, log())).toBe(0);
  const objects = emulatorStorage().bucket(bucket);
  const read = async <T>(name: string) => JSON.parse((await objects.file(name).download())[0].toString()) as T;
  const plan = await read<RunPlan>(`runs/exp/regular/${runDirKey("wf1")}${RUN_PLAN_KEY}`);
  const env = (attempt: string, task = 0) => ({
    ...Object.fromEntries((plan.export?.jobEnv ?? []).map((v) => [v.name, v.value])),
    ORBAX2REG_ATTEMPT: attempt,
    CLOUD_RUN_TASK_INDEX: String(task),
    CLOUD_RUN_TASK_COUNT: "2",
  });
  const cancel = () => objects.file(`runs/exp/regular/step_00001000/${cancelMarkerKey(EXECUTION)}`).save("{}");
  const names = async (prefix: string) => (await objects.getFiles({ prefix }))[0].map((f) => f.name);
  const exists = async (name: string) => (await objects.file(name).exists())[0];
  const runExport = `runs/exp/regular/${runDirKey("wf1")}${RUN_EXPORT_KEY}`;
  return { env, cancel, names, exists, lines, log, folder, runExport };
}

describe("cloud cancel of an export", () => {
  test("an export job started after the cancel stops before it begins: nothing planned, nothing written", async () => {
    const r = await exportRun();
    await r.cancel();
    expect(await runJob("export-begin", r.env("b1"), r.log())).toBe(0); // permanent, reported: not retried
    expect(r.lines.find((l) => l.severity === "ERROR")?.message).toMatch(/wf1 was cancelled; this job stops/);
    expect(await r.exists(r.runExport)).toBe(false);
    expect(await r.names(`${r.folder}/`)).toEqual([]);
  });

  test("a shards task started after the cancel writes no shard", async () => {
    const r = await exportRun();
    expect(await runJob("export-begin", r.env("b1"), r.log())).toBe(0);
    await r.cancel();
    expect(await runJob("export-shards", r.env("s1"), r.log())).toBe(0);
    expect(r.lines.find((l) => l.severity === "ERROR")?.message).toMatch(/was cancelled/);
    expect((await r.names(`${r.folder}/`)).filter((n) => n.endsWith(".safetensors"))).toEqual([]);
  });

  test("a cancel once every shard is written: finalize writes no index and none of the small files", async () => {
    const r = await exportRun();
    expect(await runJob("export-begin", r.env("b1"), r.log())).toBe(0);
    for (const task of [0, 1]) expect(await runJob("export-shards", r.env(`s${task}`, task), r.log())).toBe(0);
    await r.cancel();
    expect(await runJob("export-finalize", r.env("f1"), r.log())).toBe(0);
    expect(r.lines.find((l) => l.severity === "ERROR")?.message).toMatch(/was cancelled/);
    const left = await r.names(`${r.folder}/`);
    expect(left.filter((n) => n.endsWith(".safetensors"))).toHaveLength(8);
    expect(left.filter((n) => n.endsWith(".json") && !n.includes(".orbax2reg"))).toEqual([]);
  });
});

describe("the export job's lines the dashboard and alerts read", () => {
  test("shards written with mbPerSecond, export committed, and a permanent failure's ERROR line, as monitoring.tf and alerts.tf match them", async () => {
    const r = await exportRun();
    expect(await runJob("export-begin", r.env("b1"), r.log())).toBe(0);
    expect(await runJob("export-shards", r.env("s0", 0), r.log())).toBe(0);
    const written = r.lines.find((l) => l.message === "shards written");
    expect(written).toMatchObject({ severity: "INFO", phase: "export-shards" });
    expect(written?.mbPerSecond).toEqual(expect.any(Number));
    // Task 1's shards are missing: finalize fails for good, naming the first one.
    expect(await runJob("export-finalize", r.env("f1"), r.log())).toBe(0);
    const error = r.lines.find((l) => l.severity === "ERROR");
    expect(error).toMatchObject({ phase: "export-finalize", permanent: true });
    expect(String(error?.message)).toMatch(/shard missing/);
    expect(await runJob("export-shards", r.env("s1", 1), r.log())).toBe(0);
    expect(await runJob("export-finalize", r.env("f2"), r.log())).toBe(0);
    expect(r.lines.find((l) => l.message === "export committed")).toMatchObject({ severity: "INFO", phase: "export-finalize" });
    const hf = 'hf_export={steps = [1000], destination_template = "gs://regular/{root}/hf/{step}"}';
    const { logFilters, logMetricTable, alertPolicies } = await moduleDashboard([hf]);
    expect(logFilters.exports_committed).toContain('jsonPayload.message="export committed"');
    expect(logFilters.export_task_mb_per_second).toContain('jsonPayload.message="shards written"');
    expect(logMetricTable.export_task_mb_per_second?.value_extractor).toBe("EXTRACT(jsonPayload.mbPerSecond)");
    expect(alertPolicies.export_failed?.log_match).toContain('severity>=ERROR AND jsonPayload.permanent="true"');
  }, 120_000);
});

describe("export finalize's last look before it commits", () => {
  const options = { memoryBytes: DEFAULT_EXPORT_MEMORY, maxShardSize: 1000 };
  async function exported() {
    const dest = join(scratch("xfinal"), "hf");
    const began = await beginExport(EXAMPLE, dest, { ...options, tasks: 2 });
    await exportShards(
      EXAMPLE,
      dest,
      options,
      began.tasks.flatMap((t) => t.shards),
    );
    return { dest, shards: began.tasks.flatMap((t) => t.shards) };
  }

  test("runs after every shard is checked: a missing shard is named and the hook is never asked", async () => {
    const { dest, shards } = await exported();
    rmSync(join(dest, shards[3] as string));
    let asked = 0;
    await expect(finalizeExport(EXAMPLE, dest, options, { beforeCommit: async () => void asked++ })).rejects.toThrow(/shard missing/);
    expect(asked).toBe(0);
  });

  test("a stop it throws commits nothing: no index, no config.json, the shards kept for a later run", async () => {
    const { dest, shards } = await exported();
    const stop = async () => {
      throw new CancelledError("the pipeline run wf1 was cancelled; this job stops");
    };
    await expect(finalizeExport(EXAMPLE, dest, options, { beforeCommit: stop })).rejects.toThrow(/was cancelled/);
    expect(existsSync(join(dest, INDEX_NAME))).toBe(false);
    expect(existsSync(join(dest, "config.json"))).toBe(false);
    for (const s of shards) expect(existsSync(join(dest, s))).toBe(true);
    // Run again without the stop, it commits.
    expect((await finalizeExport(EXAMPLE, dest, options)).alreadyExported).toBe(false);
    expect(existsSync(join(dest, INDEX_NAME))).toBe(true);
  });
});
