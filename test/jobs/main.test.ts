import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeEach, describe, expect, test } from "vitest";
import { runJob } from "../../jobs/main.js";
import { jsonLogger } from "../../src/cloud/api/log.js";
import { RECORD_RETRY_DEADLINE_MS, RECORD_STALL_MS, recordStoreOptions } from "../../src/cloud/job/reports.js";
import {
  cancelMarkerKey,
  type FailureReport,
  failureKey,
  failuresPrefix,
  type PlanSummary,
  PROGRESS_PREFIX,
  type ProgressRecord,
  progressKey,
  RUN_ARGUMENT_KEY,
  RUN_PLAN_KEY,
  type RunPlan,
  runDirKey,
  SUMMARY_KEY,
  WORK_DIR,
} from "../../src/convert/work-dir.js";
import { fixtureCase, removeScratch, scratch } from "../helpers/convert.js";
import { moduleDashboard } from "../helpers/dashboard-json.js";
import { emulatorStorage, newBucket, uploadDir } from "../helpers/gcs.js";

// The job entry point the workflow runs, phase by phase, against local directories. What it leaves for
// the workflow (summary.json, failures/<attempt>/*.json) is the contract workflows/convert.yaml reads.

const tiny = fixtureCase("tiny");
const source = tiny.location;

let destination: string;
let lines: Record<string, unknown>[];
const log = () => jsonLogger({}, (l) => lines.push(JSON.parse(l)));
const env = (extra: Record<string, string> = {}) => ({
  ORBAX2REG_SOURCE: source,
  ORBAX2REG_DESTINATION: destination,
  ORBAX2REG_STEP: "100",
  ...extra,
});
const readJson = <T>(key: string): T => JSON.parse(readFileSync(join(destination, tiny.stepDir, key), "utf8")) as T;
/** The names of the failure reports of one job execution, as the workflow lists them. */
const reportsOf = (attempt: string): string[] => {
  const dir = join(destination, tiny.stepDir, failuresPrefix(attempt));
  return existsSync(dir) ? readdirSync(dir).sort() : [];
};

beforeEach(() => {
  destination = scratch("job");
  lines = [];
});
afterAll(removeScratch);

describe("the job entry point", () => {
  test("plan leaves a small summary for the workflow to fan out over", async () => {
    expect(await runJob("plan", env({ ORBAX2REG_GROUPS: "2" }), log())).toBe(0);
    const summary = readJson<PlanSummary>(SUMMARY_KEY);
    expect(summary).toMatchObject({ step: 100, stepDir: tiny.stepDir, groups: 2, reused: false, committed: false });
    expect(summary.arrays).toBeGreaterThan(0);
    expect(summary.bytes).toBeGreaterThan(0);
  });

  test("plan, every group and finalize commit the step; a second plan reports it committed", async () => {
    expect(await runJob("plan", env({ ORBAX2REG_GROUPS: "2" }), log())).toBe(0);
    for (const group of ["0", "1"]) expect(await runJob("convert-group", env({ ORBAX2REG_GROUP: group }), log())).toBe(0);
    expect(await runJob("finalize", env(), log())).toBe(0);
    expect(existsSync(join(destination, tiny.stepDir, "index"))).toBe(true);

    expect(await runJob("plan", env({ ORBAX2REG_GROUPS: "2" }), log())).toBe(0);
    expect(readJson<PlanSummary>(SUMMARY_KEY)).toMatchObject({ reused: true, committed: true });
  });

  test("the lines the dashboard's log-based metrics count: the plan's, and finalize's with the bytes and the conversion's duration", async () => {
    expect(await runJob("plan", env({ ORBAX2REG_GROUPS: "1" }), log())).toBe(0);
    expect(lines.map((l) => l.message)).toContain("plan written");
    expect(await runJob("convert-group", env({ ORBAX2REG_GROUP: "0" }), log())).toBe(0);
    expect(await runJob("finalize", env(), log())).toBe(0);
    const committed = lines.find((l) => l.message === "checkpoint committed");
    expect(committed).toMatchObject({ severity: "INFO", phase: "finalize", bytes: expect.any(Number) });
    expect(committed?.conversionSeconds).toBeGreaterThan(0);
    // The module's log-based metrics (terraform/modules/orbax2reg/monitoring.tf, as terraform evaluates them) match
    // exactly these messages and extract this field.
    const { logFilters, logMetricTable } = await moduleDashboard();
    for (const message of ["plan written", "reusing existing plan", "already converted; nothing to do"])
      expect(logFilters.conversions_started, message).toContain(`jsonPayload.message="${message}"`);
    expect(logFilters.conversion_seconds).toContain('jsonPayload.message="checkpoint committed"');
    expect(logMetricTable.conversion_seconds?.value_extractor).toBe("EXTRACT(jsonPayload.conversionSeconds)");
  });

  test("a permanent failure leaves a report, keyed by execution and task, naming the problem, and exits 0 so that Cloud Run does not retry it", async () => {
    expect(await runJob("plan", env(), log())).toBe(0);
    const failing = env({ ORBAX2REG_GROUP: "7", ORBAX2REG_ATTEMPT: "a1", CLOUD_RUN_EXECUTION: "orbax2reg-convert-group-x1" });
    expect(await runJob("convert-group", failing, log())).toBe(0);
    expect(reportsOf("a1")).toEqual(["permanent.task-0.attempt-0.json"]);
    const report = readJson<FailureReport>(failureKey("a1", { permanent: true, task: 0, taskAttempt: 0 }));
    expect(report).toMatchObject({
      phase: "convert-group",
      group: 7,
      task: 0,
      taskAttempt: 0,
      attempt: "a1",
      execution: "orbax2reg-convert-group-x1",
      permanent: true,
      errorType: "UsageError",
    });
    expect(report.message).toMatch(/group 7 does not exist/);
    // Truthful logs: the failure at ERROR, then why the task exits 0.
    const error = lines.findIndex((l) => l.severity === "ERROR");
    expect(lines[error]).toMatchObject({ permanent: true, group: 7, message: expect.stringMatching(/group 7 does not exist/) });
    expect(lines.at(-1)).toMatchObject({
      severity: "INFO",
      permanent: true,
      exitCode: 0,
      report: `${destination}/${tiny.stepDir}/${failureKey("a1", { permanent: true, task: 0, taskAttempt: 0 })}`,
    });
    expect(lines.findIndex((l) => l.exitCode === 0)).toBeGreaterThan(error);
  });

  test("a permanent failure whose report cannot be written exits 2: nothing else would tell the workflow", async () => {
    expect(await runJob("plan", env(), log())).toBe(0);
    const failures = join(destination, tiny.stepDir, failuresPrefix("w1"));
    mkdirSync(join(failures, "permanent.task-0.attempt-0.json"), { recursive: true }); // a directory in the way
    expect(await runJob("convert-group", env({ ORBAX2REG_GROUP: "7", ORBAX2REG_ATTEMPT: "w1" }), log())).toBe(2);
    expect(lines.some((l) => l.message === "could not write the failure report")).toBe(true);
    expect(lines.some((l) => l.exitCode === 0)).toBe(false);
  });

  test("every task and task attempt of an execution keeps its own report; other executions' reports are untouched", async () => {
    expect(await runJob("plan", env(), log())).toBe(0);
    const task = (index: number, attempt: number, extra: Record<string, string> = {}) =>
      env({ ORBAX2REG_GROUP: "9", CLOUD_RUN_TASK_INDEX: String(index), CLOUD_RUN_TASK_ATTEMPT: String(attempt), ...extra });
    // An older run of the same group failed; its report must never be read as this run's.
    expect(await runJob("convert-group", task(0, 0, { ORBAX2REG_ATTEMPT: "old" }), log())).toBe(0);
    for (const [index, attempt] of [
      [0, 0],
      [1, 0],
      [1, 1],
    ] as const) {
      expect(await runJob("convert-group", task(index, attempt, { ORBAX2REG_ATTEMPT: "new" }), log())).toBe(0);
    }
    // A later, successful run of the group removes nothing.
    expect(await runJob("convert-group", env({ ORBAX2REG_GROUP: "0", ORBAX2REG_ATTEMPT: "later" }), log())).toBe(0);
    expect(reportsOf("new")).toEqual([
      "permanent.task-0.attempt-0.json",
      "permanent.task-1.attempt-0.json",
      "permanent.task-1.attempt-1.json",
    ]);
    expect(reportsOf("old")).toEqual(["permanent.task-0.attempt-0.json"]);
    expect(reportsOf("later")).toEqual([]);
  });

  test("a failure that may be transient exits 1 and says so in the report's name", async () => {
    // The plan succeeds but its summary cannot be written (a directory is in the way): not the input's fault.
    mkdirSync(join(destination, tiny.stepDir, SUMMARY_KEY, "blocker"), { recursive: true });
    writeFileSync(join(destination, tiny.stepDir, SUMMARY_KEY, "blocker", "x"), "");
    expect(await runJob("plan", env({ ORBAX2REG_ATTEMPT: "t1" }), log())).toBe(1);
    expect(reportsOf("t1")).toEqual(["transient.task-0.attempt-0.json"]);
    expect(readJson<FailureReport>(failureKey("t1", { permanent: false, task: 0, taskAttempt: 0 }))).toMatchObject({
      phase: "plan",
      group: null,
      permanent: false,
    });
  });

  test("a destination the job cannot write (a directory in the way) is transient, logged as one line naming it", async () => {
    mkdirSync(join(destination, tiny.stepDir, SUMMARY_KEY, "blocker"), { recursive: true });
    expect(await runJob("plan", env(), log())).toBe(1);
    expect(lines.find((l) => l.severity === "ERROR")).toMatchObject({
      message: `${join(destination, tiny.stepDir, SUMMARY_KEY)}: is a directory, not a file`,
      permanent: false,
      errorType: "DestinationError",
      errorKind: "DESTINATION",
    });
  });

  test("a destination bucket that does not exist is transient too (retried, boundedly), logged as such", async () => {
    expect(await runJob("plan", env({ ORBAX2REG_DESTINATION: "gs://orbax2reg-no-such-bucket-5b3a/regular" }), log())).toBe(1);
    expect(lines.find((l) => l.severity === "ERROR")).toMatchObject({
      message: expect.stringMatching(/^gs:\/\/orbax2reg-no-such-bucket-5b3a\/regular\/\S+: no such bucket \(HTTP 404/),
      permanent: false,
      errorKind: "DESTINATION",
    });
  });

  test("without the workflow's attempt id the report is keyed by Cloud Run's execution name", async () => {
    expect(await runJob("finalize", env({ CLOUD_RUN_EXECUTION: "orbax2reg-finalize-abc12", CLOUD_RUN_TASK_ATTEMPT: "2" }), log())).toBe(2);
    expect(reportsOf("orbax2reg-finalize-abc12")).toEqual(["permanent.task-0.attempt-2.json"]);
  });

  test("with no execution id at all (a local run) no report is written, and the log says why", async () => {
    expect(await runJob("finalize", env(), log())).toBe(2);
    expect(existsSync(join(destination, tiny.stepDir, WORK_DIR, "failures"))).toBe(false);
    expect(lines.at(-1)).toMatchObject({ severity: "WARNING", message: expect.stringMatching(/no failure report written/) });
  });

  test("an attempt id that is not a plain name is refused as a key", () => {
    expect(() => failuresPrefix("../x")).toThrow(/invalid attempt id/);
    expect(() => failuresPrefix("a/b")).toThrow(/invalid attempt id/);
    expect(failuresPrefix("0f8c1a2e-9b7d-4c1e-8f00-123456789abc")).toBe(".orbax2reg/failures/0f8c1a2e-9b7d-4c1e-8f00-123456789abc/");
  });

  test("missing configuration is a permanent error that names the variable, and is reported as such", async () => {
    expect(await runJob("convert-group", env({ ORBAX2REG_ATTEMPT: "c1" }), log())).toBe(0);
    expect(lines.find((l) => l.severity === "ERROR")?.message).toMatch(/ORBAX2REG_GROUP is not set/);
    expect(reportsOf("c1")).toEqual(["permanent.task-0.attempt-0.json"]);
  });

  test.each([
    ["ORBAX2REG_GROUP", "zero"],
    ["ORBAX2REG_CONCURRENCY", "0"],
    ["ORBAX2REG_MEMORY_MIB", "lots"],
    ["CLOUD_RUN_TASK_INDEX", "-1"],
    ["CLOUD_RUN_TASK_COUNT", "0"],
  ])("a malformed %s=%j is a permanent error naming it, and is reported as such", async (name, value) => {
    expect(await runJob("plan", env(), log())).toBe(0);
    expect(await runJob("convert-group", env({ ORBAX2REG_GROUP: "0", ORBAX2REG_ATTEMPT: "m1", [name]: value }), log())).toBe(0);
    const error = lines.find((l) => l.severity === "ERROR");
    expect(error).toMatchObject({ permanent: true, errorType: "ConfigError" });
    expect(error?.message).toContain(`${name}=${JSON.stringify(value)}`);
    expect(reportsOf("m1")).toEqual(["permanent.task-0.attempt-0.json"]);
  });

  test("a malformed ORBAX2REG_STEP is refused before the phase runs", async () => {
    expect(await runJob("finalize", env({ ORBAX2REG_STEP: "latest" }), log())).toBe(2);
    expect(lines.find((l) => l.severity === "ERROR")?.message).toMatch(/ORBAX2REG_STEP="latest"/);
  });

  test("a malformed CLOUD_RUN_TASK_ATTEMPT still leaves a report, counted as the first attempt", async () => {
    const failing = env({ CLOUD_RUN_EXECUTION: "orbax2reg-finalize-x2", CLOUD_RUN_TASK_INDEX: "1", CLOUD_RUN_TASK_ATTEMPT: "again" });
    expect(await runJob("finalize", failing, log())).toBe(2);
    expect(reportsOf("orbax2reg-finalize-x2")).toEqual(["permanent.task-1.attempt-0.json"]);
  });

  test("an unknown phase is refused", async () => {
    expect(await runJob("convert", env(), log())).toBe(2);
    expect(lines.at(-1)?.message).toMatch(/unknown phase "convert"/);
  });

  test("log lines are single-line JSON with severity, message and the phase's fields", async () => {
    await runJob("plan", env(), log());
    expect(lines.at(-1)).toMatchObject({ severity: "INFO", message: "plan written", phase: "plan", step: 100 });
  });
});

describe("progress records", () => {
  /** Every record a run writes, in order, with its key relative to the step. */
  const watch = () => {
    const seen: { key: string; record: ProgressRecord }[] = [];
    const options = {
      progressEveryMs: 0,
      onProgress: (key: string, record: ProgressRecord) => seen.push({ key: key.slice(tiny.stepDir.length + 1), record }),
    };
    return { seen, options };
  };
  const cloudRun = {
    ORBAX2REG_PROJECT: "p1",
    ORBAX2REG_REGION: "europe-west4",
    CLOUD_RUN_JOB: "orbax2reg-convert-group",
    CLOUD_RUN_EXECUTION: "orbax2reg-convert-group-x7k2p",
  };

  test("keys name the phase, and the group and task of a convert-group task", () => {
    expect(progressKey("plan", null, 0)).toBe(".orbax2reg/progress/plan.json");
    expect(progressKey("convert-group", 3, 1)).toBe(".orbax2reg/progress/group-3.task-1.json");
    expect(progressKey("finalize", null, 0)).toBe(".orbax2reg/progress/finalize.json");
    expect(() => progressKey("convert-group", null, 0)).toThrow(/needs a group/);
    expect(PROGRESS_PREFIX).toBe(".orbax2reg/progress/");
  });

  test("a convert-group task's record goes from running to succeeded, counting objects and bytes", async () => {
    expect(await runJob("plan", env({ ORBAX2REG_GROUPS: "2" }), log())).toBe(0);
    const { seen, options } = watch();
    const task = env({ ORBAX2REG_GROUP: "1", ORBAX2REG_ATTEMPT: "g1", ORBAX2REG_EXECUTION: "wf-exec-1", ...cloudRun });
    expect(await runJob("convert-group", task, log(), options)).toBe(0);

    expect(new Set(seen.map((s) => s.key))).toEqual(new Set([progressKey("convert-group", 1, 0)]));
    const states = seen.map((s) => s.record.state);
    expect(states[0]).toBe("running");
    expect(states.at(-1)).toBe("succeeded");
    expect(states.slice(0, -1).every((s) => s === "running")).toBe(true);
    expect(seen.length).toBeGreaterThan(2); // written while copying, not only at start and end
    const done = seen.map((s) => s.record.bytesDone);
    expect(done).toEqual([...done].sort((a, b) => a - b));

    const last = readJson<ProgressRecord>(progressKey("convert-group", 1, 0));
    expect(last).toEqual(seen.at(-1)?.record);
    expect(last).toMatchObject({
      phase: "convert-group",
      group: 1,
      task: 0,
      taskCount: 1,
      attempt: "g1",
      workflowExecution: "wf-exec-1",
      state: "succeeded",
      error: null,
    });
    expect(last.objects).toBeGreaterThan(0);
    expect(last.objectsDone).toBe(last.objects);
    expect(last.bytesDone).toBeGreaterThan(0);
    expect(last.bytes).toBe(last.bytesDone);
    expect(Date.parse(last.updatedAt)).toBeGreaterThanOrEqual(Date.parse(last.startedAt));
  });

  test("plan and finalize write a record as they start and as they end", async () => {
    const plan = watch();
    expect(await runJob("plan", env({ ORBAX2REG_GROUPS: "1" }), log(), plan.options)).toBe(0);
    expect(plan.seen.map((s) => [s.key, s.record.state])).toEqual([
      [progressKey("plan", null, 0), "running"],
      [progressKey("plan", null, 0), "succeeded"],
    ]);
    expect(await runJob("convert-group", env({ ORBAX2REG_GROUP: "0" }), log())).toBe(0);
    const finalize = watch();
    expect(await runJob("finalize", env(), log(), finalize.options)).toBe(0);
    expect(finalize.seen.map((s) => s.record.state)).toEqual(["running", "succeeded"]);
    expect(readJson<ProgressRecord>(progressKey("finalize", null, 0))).toMatchObject({
      phase: "finalize",
      group: null,
      state: "succeeded",
    });
  });

  test("a failed task's record says failed, with the error's one line; the failure report is written as before", async () => {
    expect(await runJob("plan", env(), log())).toBe(0);
    const { seen, options } = watch();
    expect(await runJob("convert-group", env({ ORBAX2REG_GROUP: "7", ORBAX2REG_ATTEMPT: "f1" }), log(), options)).toBe(0);
    expect(seen.map((s) => s.record.state)).toEqual(["running", "failed"]);
    const record = readJson<ProgressRecord>(progressKey("convert-group", 7, 0));
    expect(record.state).toBe("failed");
    expect(record.error).toMatch(/group 7 does not exist/);
    expect(record.error).not.toMatch(/\n/);
    expect(reportsOf("f1")).toEqual(["permanent.task-0.attempt-0.json"]);
  });

  test("a task told to stop exits 143 with its record marked stopped, and leaves no failure report", async () => {
    expect(await runJob("plan", env(), log())).toBe(0);
    const { seen, options } = watch();
    const stop = new AbortController();
    stop.abort(new Error("stopped by SIGTERM"));
    expect(await runJob("finalize", env({ ORBAX2REG_ATTEMPT: "s1" }), log(), { ...options, stop: stop.signal })).toBe(143);
    expect(seen.map((s) => s.record.state)).toEqual(["stopped"]);
    expect(readJson<ProgressRecord>(progressKey("finalize", null, 0))).toMatchObject({ state: "stopped", error: "stopped by SIGTERM" });
    expect(existsSync(join(destination, tiny.stepDir, "index"))).toBe(false);
    expect(reportsOf("s1")).toEqual([]);
  });

  test("the record names the full Cloud Run execution when project, region, job and execution are all known", async () => {
    expect(await runJob("plan", env(), log())).toBe(0);
    expect(
      await runJob(
        "convert-group",
        env({ ORBAX2REG_GROUP: "0", CLOUD_RUN_TASK_INDEX: "0", CLOUD_RUN_TASK_COUNT: "2", ...cloudRun }),
        log(),
      ),
    ).toBe(0);
    expect(readJson<ProgressRecord>(progressKey("convert-group", 0, 0))).toMatchObject({
      taskCount: 2,
      execution: "projects/p1/locations/europe-west4/jobs/orbax2reg-convert-group/executions/orbax2reg-convert-group-x7k2p",
    });
    const { ORBAX2REG_REGION: _, ...noRegion } = cloudRun;
    expect(
      await runJob(
        "convert-group",
        env({ ORBAX2REG_GROUP: "0", CLOUD_RUN_TASK_INDEX: "1", CLOUD_RUN_TASK_COUNT: "2", ...noRegion }),
        log(),
      ),
    ).toBe(0);
    expect(readJson<ProgressRecord>(progressKey("convert-group", 0, 1)).execution).toBeNull();
  });

  test("records and reports retry for seconds, not the phase's minutes, and no longer than a shorter configured deadline", () => {
    const names = ["ORBAX2REG_GCS_RETRY_DEADLINE_MS", "ORBAX2REG_GCS_STALL_MS"] as const;
    const saved = names.map((n) => process.env[n]);
    try {
      for (const n of names) delete process.env[n];
      expect(recordStoreOptions()).toMatchObject({ retry: { deadlineMs: 10_000 }, timeouts: { stallMs: 5_000 } });
      expect(RECORD_RETRY_DEADLINE_MS).toBeLessThanOrEqual(20_000);
      expect(RECORD_STALL_MS).toBeLessThan(RECORD_RETRY_DEADLINE_MS);
      process.env.ORBAX2REG_GCS_RETRY_DEADLINE_MS = "2000";
      process.env.ORBAX2REG_GCS_STALL_MS = "1000";
      expect(recordStoreOptions()).toMatchObject({ retry: { deadlineMs: 2000 }, timeouts: { stallMs: 1000 } });
    } finally {
      names.forEach((n, i) => {
        if (saved[i] === undefined) delete process.env[n];
        else process.env[n] = saved[i];
      });
    }
  });

  test("a progress record that cannot be written is logged and does not fail the job", async () => {
    // A file where the progress directory should be: every progress write fails.
    mkdirSync(join(destination, tiny.stepDir, WORK_DIR), { recursive: true });
    writeFileSync(join(destination, tiny.stepDir, PROGRESS_PREFIX.slice(0, -1)), "");
    expect(await runJob("plan", env(), log())).toBe(0);
    expect(readJson<PlanSummary>(SUMMARY_KEY).committed).toBe(false);
    expect(lines.filter((l) => l.severity === "WARNING").map((l) => l.message)).toContain("could not write the progress record");
  });
});

describe("the plan job the workflow starts (ORBAX2REG_ARGUMENT)", () => {
  const EXECUTION = "projects/p/locations/us-central1/workflows/orbax2reg-convert/executions/wf1";
  /** A bucket holding the tiny step, and the environment workflows/convert.yaml gives the plan job. */
  async function workflowPlan(argument: Record<string, unknown> = {}) {
    const bucket = await newBucket("plan");
    await uploadDir(source, bucket, "runs/exp/step_00000100");
    const dest = `gs://${bucket}/runs/exp/regular`;
    const run = `${dest}/${runDirKey("wf1")}`;
    const planEnv = {
      ORBAX2REG_ARGUMENT: JSON.stringify({ source: `gs://${bucket}/runs/exp/step_00000100/`, destination: dest, ...argument }),
      ORBAX2REG_GROUPS: "3",
      ORBAX2REG_RUN: run,
      ORBAX2REG_DESTINATION: dest,
      ORBAX2REG_EXECUTION: EXECUTION,
      ORBAX2REG_ATTEMPT: "p1",
    };
    const object = async <T>(name: string): Promise<T | undefined> => {
      const file = emulatorStorage().bucket(bucket).file(name);
      return (await file.exists())[0] ? (JSON.parse((await file.download())[0].toString()) as T) : undefined;
    };
    const runObject = <T>(key: string) => object<T>(`runs/exp/regular/${runDirKey("wf1")}${key}`);
    return { bucket, dest, planEnv, object, runObject };
  }

  test("answers in the run directory with everything the workflow needs afterwards", async () => {
    const { bucket, dest, planEnv, runObject } = await workflowPlan({ tasks_per_group: "2" });
    expect(await runJob("plan", planEnv, log())).toBe(0);
    const plan = (await runObject<RunPlan>(RUN_PLAN_KEY)) as RunPlan;
    expect(plan).toMatchObject({
      source: `gs://${bucket}/runs/exp/step_00000100`,
      destination: dest,
      step: 100,
      stepDir: "step_00000100",
      work: "runs/exp/regular/step_00000100/.orbax2reg/",
      groups: 3,
      tasksPerGroup: 2,
      jobTimeout: 604800,
      reused: false,
      committed: false,
    });
    expect(plan.arrays).toBeGreaterThan(0);
    expect(plan.jobEnv).toContainEqual({ name: "ORBAX2REG_STEP", value: "100" });
    expect(plan.jobEnv).toContainEqual({ name: "ORBAX2REG_EXECUTION", value: EXECUTION });
  });

  test("writes the argument as read before planning, so a failed plan still names the step", async () => {
    const { planEnv, runObject } = await workflowPlan({ step: "100" });
    expect(await runJob("plan", planEnv, log())).toBe(0);
    expect(await runObject(RUN_ARGUMENT_KEY)).toMatchObject({ step: 100, stepDir: "step_00000100", groups: 3 });
  });

  test("keeps the step's summary.json and progress record where `orbax2reg cloud status` reads them", async () => {
    const { planEnv, object } = await workflowPlan();
    expect(await runJob("plan", planEnv, log())).toBe(0);
    expect(await object(`runs/exp/regular/step_00000100/${SUMMARY_KEY}`)).toMatchObject({ step: 100, groups: 3 });
    expect(await object(`runs/exp/regular/step_00000100/${progressKey("plan", null, 0)}`)).toMatchObject({
      state: "succeeded",
      workflowExecution: EXECUTION,
    });
  });

  test("a bad argument fails permanently, reported in the run directory with a message naming the field", async () => {
    const { planEnv, runObject } = await workflowPlan({ groups: "many" });
    expect(await runJob("plan", planEnv, log())).toBe(0);
    const report = await runObject<FailureReport>(failureKey("p1", { permanent: true, task: 0, taskAttempt: 0 }, ""));
    expect(report).toMatchObject({
      phase: "plan",
      permanent: true,
      errorType: "UsageError",
      message: 'groups must be a whole number, got "many"',
    });
    expect(await runObject(RUN_ARGUMENT_KEY)).toBeUndefined();
  });

  test("a plan for a workflow execution already cancelled stops before planning", async () => {
    const { bucket, planEnv, object } = await workflowPlan();
    await emulatorStorage()
      .bucket(bucket)
      .file(`runs/exp/regular/step_00000100/${cancelMarkerKey(EXECUTION)}`)
      .save("{}");
    expect(await runJob("plan", planEnv, log())).toBe(0); // permanent, reported: not retried by Cloud Run
    expect(lines.find((l) => l.severity === "ERROR")?.message).toMatch(/was cancelled/);
    expect(await object(`runs/exp/regular/step_00000100/${SUMMARY_KEY}`)).toBeUndefined();
  });

  test("a destination that is not the argument's is refused", async () => {
    const { planEnv } = await workflowPlan();
    expect(await runJob("plan", { ...planEnv, ORBAX2REG_DESTINATION: `${planEnv.ORBAX2REG_DESTINATION}-other` }, log())).toBe(0);
    expect(lines.find((l) => l.severity === "ERROR")?.message).toMatch(/is not the argument's destination/);
  });
});
