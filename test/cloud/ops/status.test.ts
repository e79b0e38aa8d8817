import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { type ExecutionRef, type Executions, rootLabel } from "../../../src/cloud/api/executions.js";
import { retryCanHelp, stepStatuses } from "../../../src/cloud/ops/status.js";
import { PROGRESS_PREFIX } from "../../../src/convert/work-dir.js";
import { stepDirName } from "../../../src/orbax/step.js";
import { openStore } from "../../../src/store/open.js";
import { tempDir } from "../../helpers/tmp.js";

describe("whether running a failed conversion again may help", () => {
  test("a failed job without a permanent cause: yes", () => {
    expect(retryCanHelp({ message: "group 1 failed", tags: ["OperationError"] })).toBe(true);
  });

  test("a job that found bad input (PermanentError): no", () => {
    expect(retryCanHelp({ message: "group 1: damaged chunk", tags: ["PermanentError"] })).toBe(false);
  });

  test("a bad workflow argument (ValueError): no", () => {
    expect(retryCanHelp({ message: "destination must be gs://", tags: ["ValueError"] })).toBe(false);
  });

  test("an API that refused the request (HTTP 400, 403, 404): no", () => {
    for (const code of [400, 403, 404]) expect(retryCanHelp({ tags: ["HttpError"], code })).toBe(false);
  });

  test("an API that was busy or failed (HTTP 408, 429, 5xx): yes", () => {
    for (const code of [408, 429, 500, 503]) expect(retryCanHelp({ tags: ["HttpError"], code })).toBe(true);
  });

  test("an error nobody could read: yes (nothing says it cannot help)", () => {
    expect(retryCanHelp(undefined)).toBe(true);
  });
});

const WORKFLOW = "projects/p/locations/l/workflows/orbax2reg-convert";
const ROOT = "gs://b/runs/exp";
const name = (n: number) => `${WORKFLOW}/executions/e${n}`;

/** Executions in memory, newest created first, counting the requests made of them. */
function fakeExecutions(all: ExecutionRef[]): Executions & { calls: Record<string, number> } {
  const calls = { start: 0, find: 0, findFull: 0, get: 0, cancel: 0 };
  return {
    calls,
    start: async () => {
      calls.start++;
      throw new Error("not here");
    },
    find: async () => {
      calls.find++;
      return all.map(({ name, state, startTime }) => ({ name, state, ...(startTime ? { startTime } : {}) }));
    },
    findFull: async () => {
      calls.findFull++;
      return all;
    },
    get: async (n) => {
      calls.get++;
      const e = all.find((x) => x.name === n);
      if (!e) throw new Error("5 NOT_FOUND");
      return e;
    },
    cancel: async () => {
      calls.cancel++;
      throw new Error("not here");
    },
  };
}

const execution = (n: number, step: number, state: string, extra: Partial<ExecutionRef> = {}): ExecutionRef => ({
  name: name(n),
  state,
  startTime: new Date(Date.UTC(2026, 10, 1) + n * 1000).toISOString(),
  argument: JSON.stringify({ source: `${ROOT}/${stepDirName(step)}`, destination: `${ROOT}/regular`, step }),
  labels: { step: String(step), source: rootLabel(ROOT) },
  ...extra,
});

describe("cloud status over a root with many steps", () => {
  const STEPS = 1_000;

  /** A local root of `STEPS` committed steps, and a destination where the first ten are converted. */
  function roots(): { source: string; destination: string } {
    const base = tempDir("status-scale");
    const source = join(base, "runs/exp");
    const destination = join(base, "runs/exp/regular");
    for (let s = 0; s < STEPS; s++) {
      mkdirSync(join(source, stepDirName(s)), { recursive: true });
      writeFileSync(join(source, stepDirName(s), "commit_success.txt"), "");
      if (s < 10) {
        mkdirSync(join(destination, stepDirName(s)), { recursive: true });
        writeFileSync(join(destination, stepDirName(s), "index"), "[]");
      }
    }
    return { source, destination };
  }

  test("lists the root's executions once, page by page, and asks nothing per step of the Workflows API", async () => {
    const { source, destination } = roots();
    // Per step: a failed run, then a newer succeeded one; and one step whose newest run waits QUEUED (no startTime).
    const older = Array.from({ length: STEPS }, (_, s) => execution(s, s, "FAILED", { error: '{"message":"boom"}' }));
    const newer = Array.from({ length: STEPS }, (_, s) =>
      execution(STEPS + s, s, "SUCCEEDED", { result: JSON.stringify({ bytes: 1000 + s, seconds: { total: 5 } }) }),
    );
    const queued = { ...execution(3 * STEPS, 999, "QUEUED"), startTime: undefined } as ExecutionRef;
    const executions = fakeExecutions([queued, ...newer.reverse(), ...older.reverse()]);
    let inFlight = 0;
    let most = 0;
    const rows = await stepStatuses(ROOT, undefined, {
      executions,
      workflow: WORKFLOW,
      destinationTemplate: "gs://{bucket}/{root}/regular",
      claimLeaseMs: 600_000,
      async openStore(location) {
        const store = await openStore(
          location.replace(/^gs:\/\/b\/runs\/exp\/regular/, destination).replace(/^gs:\/\/b\/runs\/exp/, source),
        );
        if (!location.includes("/regular")) return store;
        // Counts the destination requests in flight: the steps are looked at a few at a time.
        return new Proxy(store, {
          get(target, key, receiver) {
            const v = Reflect.get(target, key, receiver);
            if (key !== "stat" && key !== "read") return typeof v === "function" ? v.bind(target) : v;
            return async (...args: unknown[]) => {
              most = Math.max(most, ++inFlight);
              try {
                return await (v as (...a: unknown[]) => Promise<unknown>).apply(target, args);
              } finally {
                inFlight--;
              }
            };
          },
        });
      },
    });
    expect(rows).toHaveLength(STEPS);
    expect(executions.calls).toEqual({ start: 0, find: 0, findFull: 1, get: 0, cancel: 0 });
    expect(rows[5]?.status).toMatchObject({ state: "converted", bytes: 1005, seconds: 5, execution: name(STEPS + 5) });
    expect(rows[600]?.status).toMatchObject({ state: "not-converted", reason: "converted once, since deleted" });
    expect(rows[999]?.status).toMatchObject({ state: "running", executionState: "QUEUED", startedAt: null, elapsedSeconds: 0 });
    expect(most).toBeGreaterThan(1);
    expect(most).toBeLessThanOrEqual(16);
  });
});

describe("cloud status of a failed step", () => {
  test("names the task that was stopped (SIGTERM) when no task failed", async () => {
    const base = tempDir("status-stopped");
    const source = join(base, "runs/exp");
    const step = 7;
    mkdirSync(join(source, stepDirName(step)), { recursive: true });
    writeFileSync(join(source, stepDirName(step), "commit_success.txt"), "");
    const progress = join(source, "regular", stepDirName(step), PROGRESS_PREFIX);
    mkdirSync(progress, { recursive: true });
    const failedRun = execution(1, step, "FAILED", { error: '{"message":"group 1 failed after 3 attempts"}' });
    const record = {
      phase: "convert-group",
      group: 1,
      task: 0,
      taskCount: 1,
      attempt: "a1",
      workflowExecution: failedRun.name,
      execution: null,
      state: "stopped",
      objects: 10,
      objectsDone: 4,
      bytes: 100,
      bytesDone: 40,
      startedAt: failedRun.startTime,
      updatedAt: new Date(Date.parse(failedRun.startTime as string) + 60_000).toISOString(),
      error: "stopped by SIGTERM",
    };
    writeFileSync(join(progress, "group-1.task-0.json"), JSON.stringify(record));
    const rows = await stepStatuses(ROOT, step, {
      executions: fakeExecutions([failedRun]),
      workflow: WORKFLOW,
      destinationTemplate: "gs://{bucket}/{root}/regular",
      claimLeaseMs: 600_000,
      openStore: (location) => openStore(location.replace(/^gs:\/\/b\/runs\/exp/, source)),
    });
    expect(rows[0]?.status).toMatchObject({
      state: "failed",
      phase: "convert-group",
      group: 1,
      error: "group 1 task 0 stopped by SIGTERM: its job execution was cancelled or ran past its task timeout",
    });
  });
});

describe("cloud status of a step's Hugging Face export", () => {
  const HF = `${ROOT}/hf`;
  /** A committed step, its work directory's progress folder, and deps reading them locally. */
  function setup(prefix: string, step: number, runs: ExecutionRef[], now?: number) {
    const base = tempDir(prefix);
    const source = join(base, "runs/exp");
    mkdirSync(join(source, stepDirName(step)), { recursive: true });
    writeFileSync(join(source, stepDirName(step), "commit_success.txt"), "");
    const progress = join(source, "regular", stepDirName(step), PROGRESS_PREFIX);
    mkdirSync(progress, { recursive: true });
    const deps = {
      executions: fakeExecutions(runs),
      workflow: WORKFLOW,
      destinationTemplate: "gs://{bucket}/{root}/regular",
      claimLeaseMs: 600_000,
      openStore: (location: string) => openStore(location.replace(/^gs:\/\/b\/runs\/exp/, source)),
      ...(now === undefined ? {} : { now: () => now }),
    };
    return { source, progress, deps };
  }
  const exporting = (n: number, step: number, state: string, extra: Partial<ExecutionRef> = {}) => {
    const e = execution(n, step, state, extra);
    const argument = { ...JSON.parse(e.argument), export: { destination: `${HF}/${stepDirName(step)}` } };
    return { ...e, argument: JSON.stringify(argument) };
  };
  const record = (run: ExecutionRef, phase: string, task: number, fields: Record<string, unknown>) => ({
    phase,
    group: null,
    task,
    taskCount: 1,
    attempt: "a1",
    workflowExecution: run.name,
    execution: null,
    state: "running",
    objects: null,
    objectsDone: 0,
    bytes: null,
    bytesDone: 0,
    startedAt: run.startTime,
    updatedAt: new Date(Date.parse(run.startTime as string) + 30_000).toISOString(),
    error: null,
    ...fields,
  });

  test("a step no execution asked to export has no export", async () => {
    const { deps } = setup("status-no-export", 5, [execution(1, 5, "SUCCEEDED")]);
    const rows = await stepStatuses(ROOT, 5, deps);
    expect(rows[0]?.export).toBeNull();
  });

  test("a running export: shards done of planned, bytes so far, its phase", async () => {
    const run = exporting(1, 5, "ACTIVE");
    const start = Date.parse(run.startTime as string);
    const { progress, deps } = setup("status-export-running", 5, [run], start + 90_000);
    const write = (file: string, r: unknown) => writeFileSync(join(progress, file), JSON.stringify(r));
    write("export-begin.json", record(run, "export-begin", 0, { state: "succeeded", objects: 7, bytes: 7000 }));
    write(
      "export-shards.task-0.json",
      record(run, "export-shards", 0, { state: "succeeded", objects: 4, objectsDone: 4, bytesDone: 4000 }),
    );
    write(
      "export-shards.task-1.json",
      record(run, "export-shards", 1, { objects: 3, bytesDone: 1500, updatedAt: new Date(start + 60_000).toISOString() }),
    );
    const rows = await stepStatuses(ROOT, 5, deps);
    expect(rows[0]?.export).toEqual({
      state: "running",
      destination: `${HF}/step_00000005`,
      execution: run.name,
      shards: 7,
      shardsDone: 4,
      bytes: 7000,
      bytesDone: 5500,
      elapsedSeconds: 90,
      phase: "export-shards",
    });
  });

  test("a committed export: its index's shards and bytes, and the time from begin to finalize", async () => {
    const run = exporting(1, 5, "SUCCEEDED", { endTime: "2026-11-01T00:05:00.000Z" });
    const { source, progress, deps } = setup("status-export-committed", 5, [run]);
    const start = Date.parse(run.startTime as string);
    writeFileSync(join(progress, "export-begin.json"), JSON.stringify(record(run, "export-begin", 0, { state: "succeeded" })));
    const finished = new Date(start + 42_500).toISOString();
    writeFileSync(
      join(progress, "export-finalize.json"),
      JSON.stringify(record(run, "export-finalize", 0, { state: "succeeded", updatedAt: finished })),
    );
    mkdirSync(join(source, "hf", "step_00000005"), { recursive: true });
    writeFileSync(
      join(source, "hf", "step_00000005", "model.safetensors.index.json"),
      JSON.stringify({
        metadata: { total_size: 7000 },
        weight_map: { a: "model-00001-of-00002.safetensors", b: "model-00002-of-00002.safetensors" },
      }),
    );
    const rows = await stepStatuses(ROOT, 5, deps);
    expect(rows[0]?.export).toEqual({
      state: "committed",
      destination: `${HF}/step_00000005`,
      shards: 2,
      bytes: 7000,
      seconds: 42.5,
      finishedAt: finished,
      execution: run.name,
    });
  });

  test("a failed export names the export task that failed and whether retrying can help", async () => {
    const run = exporting(1, 5, "FAILED", { error: '{"message":"export failed","tags":["PermanentError"]}' });
    const { progress, deps } = setup("status-export-failed", 5, [run]);
    writeFileSync(
      join(progress, "export-finalize.json"),
      JSON.stringify(
        record(run, "export-finalize", 0, {
          state: "failed",
          error: "gs://b/runs/exp/hf/step_00000005/model-00001-of-00002.safetensors: shard missing\nmore",
        }),
      ),
    );
    const rows = await stepStatuses(ROOT, 5, deps);
    expect(rows[0]?.export).toMatchObject({
      state: "failed",
      phase: "export-finalize",
      error: "gs://b/runs/exp/hf/step_00000005/model-00001-of-00002.safetensors: shard missing",
      retryable: false,
    });
  });

  test("an export alone says nothing of the step's conversion: the conversion's row is the newest run that converts", async () => {
    const converted = execution(1, 5, "FAILED", { error: '{"message":"group 0 failed"}' });
    const exportOnly = exporting(2, 5, "SUCCEEDED");
    const alone = { ...exportOnly, argument: JSON.stringify({ ...JSON.parse(exportOnly.argument), convert: false }) };
    const { deps } = setup("status-export-alone", 5, [alone, converted]);
    const rows = await stepStatuses(ROOT, 5, deps);
    expect(rows[0]?.status).toMatchObject({ state: "failed", execution: converted.name });
    expect(rows[0]?.export).toEqual({ state: "pruned", destination: `${HF}/step_00000005`, execution: alone.name });
  });

  const alone = (n: number, step: number, state: string, extra: Partial<ExecutionRef> = {}) => {
    const e = exporting(n, step, state, extra);
    return { ...e, argument: JSON.stringify({ ...JSON.parse(e.argument), convert: false }) };
  };

  test("a step that is only being exported is exporting, not not-converted (its export line says how far)", async () => {
    const run = alone(1, 5, "ACTIVE");
    const start = Date.parse(run.startTime as string);
    const { deps } = setup("status-alone-running", 5, [run], start + 90_000);
    const rows = await stepStatuses(ROOT, 5, deps);
    expect(rows[0]?.status).toEqual({
      state: "exporting",
      execution: run.name,
      executionState: "ACTIVE",
      startedAt: run.startTime,
      elapsedSeconds: 90,
    });
    expect(rows[0]?.export?.state).toBe("running");
  });

  test("after an export alone succeeded, the step is exported, and still not converted", async () => {
    const run = alone(1, 5, "SUCCEEDED", { endTime: "2026-11-01T00:05:00.000Z" });
    const { deps } = setup("status-alone-exported", 5, [run]);
    const rows = await stepStatuses(ROOT, 5, deps);
    expect(rows[0]?.status).toEqual({ state: "exported", execution: run.name, finishedAt: "2026-11-01T00:05:00.000Z" });
  });

  test("after an export alone failed, the step is failed, marked export only, with the export task's error", async () => {
    const run = alone(1, 5, "FAILED", { error: '{"message":"export begin failed","tags":["PermanentError"]}' });
    const { progress, deps } = setup("status-alone-failed", 5, [run]);
    writeFileSync(
      join(progress, "export-begin.json"),
      JSON.stringify(record(run, "export-begin", 0, { state: "failed", error: "gs://b/tok.model: not found" })),
    );
    const rows = await stepStatuses(ROOT, 5, deps);
    expect(rows[0]?.status).toMatchObject({
      state: "failed",
      exportOnly: true,
      execution: run.name,
      phase: "export-begin",
      error: "gs://b/tok.model: not found",
      retryable: false,
    });
  });

  test("an export alone older than the step's conversion run does not hide it", async () => {
    const older = alone(1, 5, "SUCCEEDED");
    const cancelled = execution(2, 5, "CANCELLED");
    const { deps } = setup("status-alone-older", 5, [cancelled, older]);
    const rows = await stepStatuses(ROOT, 5, deps);
    expect(rows[0]?.status).toEqual({ state: "cancelled", execution: cancelled.name, finishedAt: null });
  });

  test("the newest execution that asked for an export is the one shown, not a newer conversion alone", async () => {
    const asked = exporting(1, 5, "CANCELLED", { endTime: "2026-11-01T00:05:00.000Z" });
    const later = execution(2, 5, "SUCCEEDED");
    const { deps } = setup("status-export-newest", 5, [later, asked]);
    const rows = await stepStatuses(ROOT, 5, deps);
    expect(rows[0]?.export).toEqual({
      state: "cancelled",
      destination: `${HF}/step_00000005`,
      execution: asked.name,
      finishedAt: "2026-11-01T00:05:00.000Z",
    });
  });
});
