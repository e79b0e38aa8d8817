import { spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { ExecutionsClient } from "@google-cloud/run";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { type JobExecutions, runExecutionsClient, runJobExecutions } from "../../../src/cloud/api/run-executions.js";
import { RunApiError } from "../../../src/errors.js";
import { startRunApi } from "../../e2e/emulators.js";
import { removeScratch, scratch } from "../../helpers/convert.js";
import { processAlive, type Running } from "../../helpers/servers.js";

// The Run v2 job-executions client against the loopback stand-in of the Run Admin API (test/e2e/run-api.mjs),
// which serves executions from the state files the e2e harness keeps (test/e2e/run-state.mjs). Here those
// files are written by hand; a "runner" is a sleeping process the stand-in kills on cancel, as it kills the
// harness's runner and its tasks.

const JOB = "projects/test-project/locations/us-central1/jobs/orbax2reg-convert-group";
const name = (id: string) => `${JOB}/executions/${id}`;
const CREATED = "2026-01-02T03:04:05.000Z";

let stateDir: string;
let api: Running;
let executions: JobExecutions;
const runners: number[] = [];

type TaskState = "pending" | "running" | "succeeded" | "failed" | "cancelled";
function writeExecution(id: string, tasks: TaskState[], extra: Record<string, unknown> = {}): void {
  const state = {
    operation: `projects/test-project/locations/us-central1/operations/${id}`,
    execution: name(id),
    job: JOB,
    phase: "convert-group",
    taskCount: tasks.length,
    tasks: tasks.map((state) => ({ state })),
    createTime: CREATED,
    done: false,
    ...extra,
  };
  writeFileSync(join(stateDir, `${id}.json`), JSON.stringify(state));
}
const readExecution = (id: string) => JSON.parse(readFileSync(join(stateDir, `${id}.json`), "utf8"));

/** A process standing in for an execution's runner: its own process group, sleeping until killed. */
function startRunner(): number {
  const child = spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)"], { detached: true, stdio: "ignore" });
  child.unref();
  if (child.pid === undefined) throw new Error("could not start the runner");
  runners.push(child.pid);
  return child.pid;
}

beforeAll(async () => {
  stateDir = scratch("run-api");
  api = await startRunApi(stateDir, join(stateDir, "run-api.log"));
  executions = runJobExecutions(await runExecutionsClient(api.url));
}, 30_000);

beforeEach(() => {
  writeExecution("running-1", ["succeeded", "running", "running"], { runnerPid: startRunner() });
  writeExecution("finished-1", ["succeeded", "succeeded"], { done: true, completionTime: "2026-01-02T03:14:05.000Z", response: {} });
});

afterAll(async () => {
  for (const pid of runners) {
    try {
      process.kill(-pid, "SIGKILL");
    } catch {}
  }
  await api?.stop();
  removeScratch();
});

describe("Cloud Run job executions", () => {
  test("get reports a running execution's task counts, creation time and logs", async () => {
    const s = await executions.get(name("running-1"));
    expect(s).toMatchObject({
      name: name("running-1"),
      taskCount: 3,
      running: 2,
      succeeded: 1,
      failed: 0,
      cancelled: 0,
      done: false,
      createTime: CREATED,
      completionTime: null,
    });
    expect(s?.logUri).toMatch(/^https:\/\//);
  });

  test("get reports a finished execution as done, with its completion time", async () => {
    expect(await executions.get(name("finished-1"))).toMatchObject({
      taskCount: 2,
      running: 0,
      succeeded: 2,
      done: true,
      completionTime: "2026-01-02T03:14:05.000Z",
    });
  });

  test("get of an execution Cloud Run does not know is undefined", async () => {
    expect(await executions.get(name("no-such-execution"))).toBeUndefined();
    // Same id under another job: a different execution.
    expect(await executions.get(`${JOB.replace("convert-group", "plan")}/executions/running-1`)).toBeUndefined();
  });

  test("cancel stops a running execution: its processes are gone, its unfinished tasks count as cancelled", async () => {
    const runner = readExecution("running-1").runnerPid as number;
    await executions.cancel(name("running-1"));
    expect(processAlive(runner)).toBe(false);
    expect(await executions.get(name("running-1"))).toMatchObject({ done: true, running: 0, succeeded: 1, cancelled: 2 });
  });

  test("cancel of a finished execution resolves and changes nothing", async () => {
    await expect(executions.cancel(name("finished-1"))).resolves.toBeUndefined();
    expect(await executions.get(name("finished-1"))).toMatchObject({ done: true, succeeded: 2, cancelled: 0 });
  });

  test("cancel of an execution that is gone resolves", async () => {
    await expect(executions.cancel(name("no-such-execution"))).resolves.toBeUndefined();
  });
});

describe("retries", () => {
  /** A client whose getExecution fails with these gRPC codes first, then answers. */
  const flaky = (codes: number[]) => {
    let calls = 0;
    const client = {
      getExecution: async (request: { name: string }) => {
        const code = codes[calls++];
        if (code !== undefined) throw Object.assign(new Error(`injected ${code}`), { code });
        return [{ name: request.name, taskCount: 1, succeededCount: 1, completionTime: { seconds: 1767323645, nanos: 0 } }];
      },
    };
    return { client: client as unknown as ExecutionsClient, calls: () => calls };
  };

  test("get rides out UNAVAILABLE and DEADLINE_EXCEEDED", async () => {
    const f = flaky([14, 4]);
    expect(await runJobExecutions(f.client).get(name("x"))).toMatchObject({
      succeeded: 1,
      done: true,
      completionTime: "2026-01-02T03:14:05.000Z",
    });
    expect(f.calls()).toBe(3);
  });

  test("get gives up after a few tries, and at once on an error a retry cannot fix", async () => {
    const down = flaky([14, 14, 14, 14, 14]);
    await expect(runJobExecutions(down.client).get(name("x"))).rejects.toBeInstanceOf(RunApiError);
    expect(down.calls()).toBe(4);
    const denied = flaky([7]);
    await expect(runJobExecutions(denied.client).get(name("x"))).rejects.toMatchObject({ name: "RunApiError", code: 7 });
    expect(denied.calls()).toBe(1);
  });
});
