import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test, vi } from "vitest";
import type { ConversionEvent } from "../../src/cloud/api/events.js";
import { executionLabels } from "../../src/cloud/api/executions.js";
import { CLAIM_KEY } from "../../src/convert/work-dir.js";
import { runBin, runBinAsync } from "../helpers/cli.js";
import { cpuQuota, memoryQuota, startQuotaStandIn } from "../helpers/cloud-quotas.js";
import { fixtureCase, removeScratch, scratch } from "../helpers/convert.js";
import { startTriggerStandIn } from "../helpers/eventarc-stand-in.js";
import { emulatorStorage, newBucket, uploadDir } from "../helpers/gcs.js";
import { freePort, type Running } from "../helpers/servers.js";
import { type Deployed, deployedSettings } from "./deployed.js";
import { printLogsOnFailure, startFunction } from "./emulators.js";
import { type Execution, type Pipeline, PROJECT, startPipeline } from "./pipeline-harness.js";

// Each test waits on workflow retries with real backoff and several processes per job: ~10-25 s on an idle
// machine, up to 5x that when the 2 cores are shared (seen in the full suite). A deadline, not a timing check.
vi.setConfig({ testTimeout: 180_000 });

// The whole Google Cloud pipeline on loopback, no cloud project: a real Orbax checkpoint lands in a
// fake-gcs-server bucket, its finalize events go to the trigger function served by the real
// functions-framework, which claims the step and starts the real workflows/convert.yaml on the Workflows
// emulator; the workflow's connector calls run the real job entry point as local processes against
// fake-gcs-server (test/e2e/connector-hook.mjs) and publish to the Pub/Sub emulator. The harness that starts them
// (pipeline-harness.ts) is export-pipeline.test.ts's too.

const tiny = fixtureCase("tiny"); // 15 arrays
const STEP = "runs/exp/step_00000100";
const CLAIM = `runs/exp/regular/step_00000100/${CLAIM_KEY}`;

let work: string;
/** The emulators, the workflow and the function as the example root deploys it by default (pipeline-harness.ts). */
let p: Pipeline;
let workflows: Running;
/** The function as the example root deploys it by default: the whole bucket watched. */
let fn: Running;
/** The same with checkpoint_prefixes = ["runs"]. */
let fnRuns: Running;
let functionEnv: NodeJS.ProcessEnv;
let deployed: Deployed;
let WORKFLOW: string;
let GROUPS: number;

// Required variables of the example root without defaults; the function reads none of them.
// The regular checkpoints next to the Orbax ones, in the bucket each test makes (the example's own bucket for them is
// its default: terraform/examples/basic; these tests are about the pipeline, not where it writes).
const TFVARS = { project_id: PROJECT, checkpoint_bucket: "ckpts", convert_into_checkpoint_bucket: true };

beforeAll(async () => {
  work = scratch("e2e");
  deployed = await deployedSettings(TFVARS);
  const watchingRuns = await deployedSettings({ ...TFVARS, checkpoint_prefixes: ["runs"] });
  WORKFLOW = deployed.functionEnv.ORBAX2REG_WORKFLOW as string;
  GROUPS = Number(deployed.workflowEnv.ORBAX2REG_GROUPS);
  p = await startPipeline(work, deployed);
  ({ workflows, fn, functionEnv } = p);
  fnRuns = await startFunction({ ...watchingRuns.functionEnv, ...p.endpoints }, join(work, "function-runs.log"));
}, 180_000);

// A failed test prints the end of what the pipeline logged, so that a failure seen once in CI can be read.
printLogsOnFailure(() => work, ["hooks.jsonl", "jobs.jsonl", "workflows.log", "function.log", "function-runs.log", "pubsub.log"]);

afterAll(async () => {
  await Promise.all([fnRuns?.stop(), p?.stop()]);
  removeScratch();
});

/** Uploads the tiny fixture as a step under `bucket`, its step-level commit marker last (as Orbax does). */
async function writeCheckpoint(bucket: string): Promise<string[]> {
  const marker = "commit_success.txt";
  await uploadDir(tiny.location, bucket, STEP, (k) => k === marker);
  await uploadDir(tiny.location, bucket, STEP, (k) => k !== marker);
  const [files] = await emulatorStorage()
    .bucket(bucket)
    .getFiles({ prefix: `${STEP}/` });
  const names = files.map((f) => f.name).filter((n) => n !== `${STEP}/${marker}`);
  return [...names, `${STEP}/${marker}`];
}

const deliver = (data: { bucket: string; name: string; generation?: unknown }, url = fn.url) => p.deliver(data, url);
const finalized = (bucket: string, name: string, url = fn.url) => p.finalized(bucket, name, url);
/** The event for a name that need not exist (the function must decide without looking). */
const finalizedName = (bucket: string, name: string, url = fn.url) => deliver({ bucket, name, generation: "1" }, url);
const executionsOf = (bucket: string) => p.executionsOf(bucket);
const startByHand = (argument: unknown) => p.startByHand(argument);
const finished = (execution: Execution) => p.finished(execution);
const eventsFor = (destination: string, type: ConversionEvent["type"], count = 1) => p.eventsFor(destination, type, count);
const hookCalls = (destination: string) => p.hookCalls(destination);

/** Each task attempt the hook ran for `destination`'s `phase` (as Cloud Run runs a task again after a non-zero exit). */
const taskAttempts = (destination: string, phase: string) =>
  hookCalls(destination)
    .filter((c) => c.connector === "task" && c.job === phase)
    .map((c) => ({ group: c.group ?? null, attempt: c.attempt, code: c.code }));

const jobLines = () => p.jobLines();

/** Makes every job execution of `group` for `destination` fail the way a killed task does (no report). */
const injectFault = (destination: string, group: number) => p.setFaults([{ destination, group }]);
const clearFaults = () => p.setFaults([]);

async function exists(bucket: string, name: string): Promise<boolean> {
  const [found] = await emulatorStorage().bucket(bucket).file(name).exists();
  return found;
}

/**
 * Queues faults for the Workflows emulator's next createExecution calls, or executions.list calls
 * (tools/workflows-emulator/wfemu.py).
 */
async function injectWorkflowsFaults(faults: string[], call: "createExecution" | "listExecutions" = "createExecution"): Promise<void> {
  const r = await fetch(`${workflows.url}/_emulator/faults`, { method: "POST", body: JSON.stringify({ [call]: faults }) });
  expect(r.ok).toBe(true);
}

async function pendingWorkflowsFaults(call: "createExecution" | "listExecutions" = "createExecution"): Promise<string[]> {
  return ((await (await fetch(`${workflows.url}/_emulator/faults`)).json()) as Record<string, string[]>)[call] ?? [];
}

async function until(condition: () => Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function claimOf(bucket: string): Promise<Record<string, unknown>> {
  const [bytes] = await emulatorStorage().bucket(bucket).file(CLAIM).download();
  return JSON.parse(bytes.toString());
}

/** Makes the step's claim look `seconds` old: the time a redelivery would come after. */
async function ageClaim(bucket: string, seconds: number): Promise<void> {
  const claim = await claimOf(bucket);
  const claimedAt = new Date(Date.parse(claim.claimedAt as string) - seconds * 1000).toISOString();
  await emulatorStorage()
    .bucket(bucket)
    .file(CLAIM)
    .save(JSON.stringify({ ...claim, claimedAt }), { resumable: false });
}

/**
 * Eventarc's stand-in for commands that write to the bucket themselves: delivers a finalize event to the
 * function for every object that appears (Eventarc delivers one per object, commit marker included).
 */
function eventarcStandIn(bucket: string, url: string): { stop(): Promise<void> } {
  const delivered = new Set<string>();
  let running = true;
  const loop = (async () => {
    while (running) {
      const [files] = await emulatorStorage().bucket(bucket).getFiles();
      for (const f of files) {
        const key = `${f.name}#${f.metadata.generation}`;
        if (delivered.has(key)) continue;
        delivered.add(key);
        await deliver({ ...f.metadata, bucket, name: f.name }, url);
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
    },
  };
}

describe("the pipeline on local emulators", () => {
  test("a step committed to the bucket is converted, verified and announced", async () => {
    const bucket = await newBucket("train");
    const destination = `gs://${bucket}/runs/exp/regular`;
    for (const name of await writeCheckpoint(bucket)) expect(await finalized(bucket, name)).toBe(204);

    const started = await executionsOf(bucket);
    expect(started).toHaveLength(1);
    expect(started[0]?.labels).toEqual(executionLabels(`gs://${bucket}/${STEP}`, 100));
    const done = await finished(started[0] as Execution);
    expect(done.state).toBe("SUCCEEDED");
    expect(JSON.parse(done.result as string)).toMatchObject({
      step: 100,
      groups: GROUPS,
      arrays: 15,
      destination: `${destination}/step_00000100`,
    });

    const verify = runBin(["verify", `gs://${bucket}/${STEP}`, `${destination}/step_00000100`]);
    expect(verify.stdout).toMatch(/\d+ passed, 0 failed/);
    expect(verify.code).toBe(0);

    const [requested] = await eventsFor(destination, "conversion.requested");
    const [succeeded] = await eventsFor(destination, "conversion.succeeded");
    expect(requested?.event).toMatchObject({ step: 100, source: `gs://${bucket}/${STEP}`, execution: started[0]?.name });
    expect(succeeded?.attributes).toEqual({ type: "conversion.succeeded", step: "100" });
    expect(succeeded?.event).toMatchObject({ step: 100, arrays: 15, error: null, execution: started[0]?.name });
    expect(succeeded?.event.bytes).toBeGreaterThan(0);
  });

  test("the same commit event delivered twice starts one execution", async () => {
    const bucket = await newBucket("train");
    const names = await writeCheckpoint(bucket);
    const marker = names.at(-1) as string;
    expect(await Promise.all([finalized(bucket, marker), finalized(bucket, marker)])).toEqual([204, 204]);
    expect(await finalized(bucket, marker)).toBe(204);

    const started = await executionsOf(bucket);
    expect(started).toHaveLength(1);
    expect((await finished(started[0] as Execution)).state).toBe("SUCCEEDED");
  });

  test("a group that keeps failing is retried, then conversion.failed names it and nothing is committed", async () => {
    const bucket = await newBucket("train");
    const destination = `gs://${bucket}/runs/exp/regular`;
    injectFault(destination, 1);
    try {
      const names = await writeCheckpoint(bucket);
      expect(await finalized(bucket, names.at(-1) as string)).toBe(204);
      const [execution] = await executionsOf(bucket);
      const done = await finished(execution as Execution);
      expect(done.state).toBe("FAILED");
      expect(JSON.parse(done.error?.payload as string)).toMatchObject({ tags: ["ConversionFailed"], groups: ["1"] });
    } finally {
      clearFaults();
    }
    const runs = hookCalls(destination).filter((c) => c.phase === "convert-group");
    expect(runs.filter((c) => c.group === "1")).toHaveLength(3); // the first attempt and two retries
    expect(runs.filter((c) => c.group !== "1")).toHaveLength(GROUPS - 1);
    expect(hookCalls(destination).some((c) => c.phase === "finalize")).toBe(false);

    const [failed] = await eventsFor(destination, "conversion.failed");
    expect(failed?.attributes).toEqual({ type: "conversion.failed", step: "100" });
    expect(failed?.event.error).toMatch(new RegExp(`1 of ${GROUPS} groups failed; group 1 failed: .*terminated \\(injected\\)`));
    expect(await exists(bucket, "runs/exp/regular/step_00000100/index")).toBe(false);
  });

  test("running the workflow again from the console resumes a failed conversion and commits it", async () => {
    const bucket = await newBucket("train");
    const destination = `gs://${bucket}/runs/exp/regular`;
    const argument = { source: `gs://${bucket}/${STEP}`, destination };
    await writeCheckpoint(bucket);
    injectFault(destination, 2);
    const first = await finished(await startByHand(argument)).finally(clearFaults);
    expect(first.state).toBe("FAILED");

    const second = await finished(await startByHand(argument));
    expect(second.state).toBe("SUCCEEDED");
    expect(JSON.parse(second.result as string)).toMatchObject({ resumed: true, already_converted: false });
    // Only the failed group had anything left to write.
    const groupsDone = jobLines().filter((l) => l.message === "group done" && l.execution === second.name);
    expect(groupsDone).toHaveLength(GROUPS);
    expect(groupsDone.filter((l) => (l.written as number) > 0).map((l) => l.group)).toEqual([2]);
    expect(runBin(["verify", argument.source, `${destination}/step_00000100`]).code).toBe(0);

    const third = await finished(await startByHand(argument));
    expect(JSON.parse(third.result as string)).toMatchObject({ already_converted: true });
    expect(hookCalls(destination).filter((c) => c.phase === "finalize")).toHaveLength(1);
  });

  test("a job that fails on bad input is not retried, and conversion.failed says why", async () => {
    const bucket = await newBucket("train");
    const destination = `gs://${bucket}/regular`;
    const done = await finished(await startByHand({ source: `gs://${bucket}/runs/exp/step_00000300`, destination }));
    expect(done.state).toBe("FAILED");
    expect(hookCalls(destination).filter((c) => c.phase === "plan")).toHaveLength(1);
    // One attempt of the task: it reported the failure and exited 0, so Cloud Run did not run it again.
    expect(taskAttempts(destination, "plan")).toEqual([{ group: null, attempt: 0, code: 0 }]);
    expect(JSON.parse(done.error?.payload as string)).toMatchObject({ tags: ["PermanentError"] });
    const [failed] = await eventsFor(destination, "conversion.failed");
    expect(failed?.event.error).toMatch(/^plan: gs:\/\/.*step_00000300: no Orbax checkpoint here/);
    expect(failed?.event.step).toBe(300);
  });

  test("a group that finds damaged data ends at its first attempt, and the execution fails with one message naming the file", async () => {
    const bucket = await newBucket("train");
    const destination = `gs://${bucket}/runs/exp/regular`;
    await writeCheckpoint(bucket);
    // The data file holding the chunks, cut short after the checkpoint was committed.
    const damaged = `${STEP}/state/ocdbt.process_0/d/b2a63ebe4de088f4101b266b4099e05d`;
    const file = emulatorStorage().bucket(bucket).file(damaged);
    const [bytes] = await file.download();
    await file.save(bytes.subarray(0, 1000), { resumable: false });

    const done = await finished(await startByHand({ source: `gs://${bucket}/${STEP}`, destination }));
    expect(done.state).toBe("FAILED");
    const failedGroups = JSON.parse(done.error?.payload as string).groups as string[];
    expect(failedGroups.length).toBeGreaterThan(0);
    const runs = hookCalls(destination).filter((c) => c.phase === "convert-group");
    for (const g of failedGroups) expect(runs.filter((c) => c.group === g)).toHaveLength(1);
    // One task attempt per failed group (Cloud Run retries a task only when it exits non-zero: max_retries is
    // deployed.jobMaxRetries), which logged the failure once, at ERROR, and then why it exits 0.
    expect(deployed.jobMaxRetries).toBeGreaterThan(0);
    const attempts = taskAttempts(destination, "convert-group");
    for (const g of failedGroups) expect(attempts.filter((a) => a.group === g)).toEqual([{ group: g, attempt: 0, code: 0 }]);
    const logged = jobLines().filter((l) => l.execution === done.name && failedGroups.includes(String(l.group)));
    const errors = logged.filter((l) => l.severity === "ERROR");
    expect(errors).toHaveLength(failedGroups.length);
    for (const e of errors) expect(e).toMatchObject({ permanent: true, message: expect.stringMatching(/short read/) });
    expect(logged.filter((l) => l.exitCode === 0)).toHaveLength(failedGroups.length);
    const message = new RegExp(`group \\d+: gs://${bucket}/${damaged}, offset \\d+: short read`);
    expect(JSON.parse(done.error?.payload as string).message).toMatch(message);
    const [failed] = await eventsFor(destination, "conversion.failed");
    expect(failed?.event.error).toMatch(message);
    expect(await exists(bucket, "runs/exp/regular/step_00000100/index")).toBe(false);
  });

  test("an argument without a destination fails at once with a message naming the field", async () => {
    const done = await finished(await startByHand({ source: "gs://b/runs/exp/step_00000100" }));
    expect(done.state).toBe("FAILED");
    expect(JSON.parse(done.error?.payload as string).message).toMatch(/needs "source" .* and "destination"/);
  });

  test("an emergency-checkpointer step starts when its second half lands, and converts", async () => {
    const bucket = await newBucket("train");
    const emergency = fixtureCase("emergency");
    const root = "runs/emergency";
    const destination = `gs://${bucket}/${root}/regular`;
    // The tensors half first (its commit marker last), then the non-tensors half with its index.
    const tensors = `${root}/tensors/step_00000100`;
    const marker = (k: string) => k === "commit_success.txt";
    await uploadDir(join(emergency.location, "tensors/step_00000100"), bucket, tensors, marker);
    await uploadDir(join(emergency.location, "tensors/step_00000100"), bucket, tensors, (k) => !marker(k));
    expect(await finalized(bucket, `${tensors}/commit_success.txt`)).toBe(204);
    expect(await executionsOf(bucket)).toHaveLength(0); // the other half is not there yet
    await uploadDir(join(emergency.location, "non-tensors/step_00000100"), bucket, `${root}/non-tensors/step_00000100`);
    expect(await finalized(bucket, `${root}/non-tensors/step_00000100/index`)).toBe(204);

    const [execution] = await executionsOf(bucket);
    expect(JSON.parse(execution?.argument as string)).toMatchObject({ source: `gs://${bucket}/${tensors}`, destination, step: 100 });
    expect((await finished(execution as Execution)).state).toBe("SUCCEEDED");
    expect(runBin(["verify", `gs://${bucket}/${tensors}`, `${destination}/step_00000100`]).code).toBe(0);
  });

  test("tasks_per_group splits every group between Cloud Run tasks", async () => {
    const bucket = await newBucket("train");
    const destination = `gs://${bucket}/runs/exp/regular`;
    await writeCheckpoint(bucket);
    const done = await finished(await startByHand({ source: `gs://${bucket}/${STEP}`, destination, groups: 2, tasks_per_group: 3 }));
    expect(done.state).toBe("SUCCEEDED");
    const runs = hookCalls(destination).filter((c) => c.phase === "convert-group");
    expect(runs.map((c) => c.taskCount)).toEqual([3, 3]);
    const tasks = jobLines().filter((l) => l.message === "group done" && l.execution === done.name);
    expect(tasks.map((l) => `${l.group}/${l.task}`).sort()).toEqual(["0/0", "0/1", "0/2", "1/0", "1/1", "1/2"]);
    expect(runBin(["verify", `gs://${bucket}/${STEP}`, `${destination}/step_00000100`]).code).toBe(0);
  });

  test("a malformed event is acknowledged, not retried, starts nothing, and is logged at ERROR as dropped", async () => {
    const response = await fetch(fn.url, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "ce-specversion": "1.0",
        "ce-id": "malformed-1",
        "ce-type": "google.cloud.storage.object.v1.finalized",
        "ce-source": "//storage.googleapis.com/projects/_/buckets/x",
      },
      body: JSON.stringify({ kind: "storage#object" }),
    });
    expect(response.status).toBe(204);
    const logged = async () => {
      for (let i = 0; i < 50; i++) {
        const line = readFileSync(join(work, "function.log"), "utf8")
          .split("\n")
          .find((l) => l.includes('"malformed-1"'));
        if (line) return JSON.parse(line);
        await new Promise((r) => setTimeout(r, 100));
      }
    };
    // Dropped, so an ERROR: the trigger-side alert sees it (src/cloud/trigger/severity.ts).
    expect(await logged()).toMatchObject({
      severity: "ERROR",
      message: expect.stringMatching(/^malformed storage event dropped/),
      eventId: "malformed-1",
    });
  });

  test("when the workflow cannot be started the event fails, for the platform to redeliver, and the claim is released", async () => {
    const bucket = await newBucket("train");
    const marker = (await writeCheckpoint(bucket)).at(-1) as string;
    const unreachable = await freePort(); // nothing listens there: the Workflows API is "down"
    const broken = await startFunction(
      { ...functionEnv, ORBAX2REG_WORKFLOWS_ENDPOINT: `http://127.0.0.1:${unreachable}` },
      join(work, "function-broken.log"),
    );
    try {
      expect(await finalized(bucket, marker, broken.url)).toBe(500);
    } finally {
      await broken.stop();
    }
    expect(await exists(bucket, CLAIM)).toBe(false);

    expect(await finalized(bucket, marker)).toBe(204); // the redelivery
    const started = await executionsOf(bucket);
    expect(started).toHaveLength(1);
    expect((await finished(started[0] as Execution)).state).toBe("SUCCEEDED");
  });

  test("the deployed default watches the whole bucket: a checkpoint root at the bucket's top level converts", async () => {
    expect(deployed.functionEnv.ORBAX2REG_ROOT_PREFIXES).toBe("");
    const bucket = await newBucket("train");
    await uploadDir(tiny.location, bucket, "step_00000100");
    expect(await finalized(bucket, "step_00000100/commit_success.txt")).toBe(204);
    const [execution] = await executionsOf(bucket);
    expect(JSON.parse(execution?.argument as string)).toMatchObject({
      source: `gs://${bucket}/step_00000100`,
      destination: `gs://${bucket}/regular`,
    });
    expect((await finished(execution as Execution)).state).toBe("SUCCEEDED");
  });

  test("a misconfigured function acknowledges events and logs one ERROR naming the variable", async () => {
    const log = join(work, "function-misconfigured.log");
    const bad = await startFunction({ ...functionEnv, ORBAX2REG_WORKFLOW: "orbax2reg-convert" }, log);
    try {
      const bucket = await newBucket("train");
      expect(await finalizedName(bucket, `${STEP}/commit_success.txt`, bad.url)).toBe(204);
      expect(await finalizedName(bucket, `${STEP}/commit_success.txt`, bad.url)).toBe(204);
      expect(await executionsOf(bucket)).toHaveLength(0);
    } finally {
      await bad.stop();
    }
    const lines = readFileSync(log, "utf8")
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l));
    expect(lines.filter((l) => l.severity === "ERROR")).toEqual([
      expect.objectContaining({
        variable: "ORBAX2REG_WORKFLOW",
        value: "orbax2reg-convert",
        message: expect.stringMatching(/ORBAX2REG_WORKFLOW="orbax2reg-convert"/),
      }),
    ]);
  });

  test("a function killed between claiming and starting: the redelivery after the claim's lease converts the step", async () => {
    const bucket = await newBucket("train");
    const marker = (await writeCheckpoint(bucket)).at(-1) as string;
    await injectWorkflowsFaults(["hang-then-fail:10"]); // createExecution hangs; the function dies meanwhile
    const doomed = await startFunction(functionEnv, join(work, "function-killed.log"));
    const delivery = finalized(bucket, marker, doomed.url).catch(() => "connection reset");
    // Killed while its createExecution call hangs: the claim is written, the call consumed the fault.
    await until(async () => (await exists(bucket, CLAIM)) && (await pendingWorkflowsFaults()).length === 0);
    await doomed.stop("SIGKILL");
    await delivery;
    expect(await executionsOf(bucket)).toHaveLength(0);

    // The platform redelivers; once the lease (longer than the function's timeout) is over, it takes over.
    await ageClaim(bucket, Number(functionEnv.ORBAX2REG_CLAIM_LEASE_SECONDS ?? 600) + 1);
    expect(await finalized(bucket, marker)).toBe(204);
    const started = await executionsOf(bucket);
    expect(started).toHaveLength(1);
    expect((await finished(started[0] as Execution)).state).toBe("SUCCEEDED");
    expect(await finalized(bucket, marker)).toBe(204);
    expect(await executionsOf(bucket)).toHaveLength(1);
  });

  test("a function stopped between claiming and starting for longer than the lease starts nothing when it continues: one execution", async () => {
    const bucket = await newBucket("train");
    const marker = (await writeCheckpoint(bucket)).at(-1) as string;
    // Its look-up before starting is answered (nothing exists yet) while it is stopped: it reads that when it continues.
    await injectWorkflowsFaults(["late-answer:2"], "listExecutions");
    const stopped = await startFunction(functionEnv, join(work, "function-stopped.log"));
    try {
      const delivery = finalized(bucket, marker, stopped.url).catch(() => 0);
      await until(async () => (await exists(bucket, CLAIM)) && (await pendingWorkflowsFaults("listExecutions")).length === 0);
      process.kill(stopped.pid, "SIGSTOP"); // throttled past its timeout, as a gen2 instance may be

      // Meanwhile the lease ends (the claim made to look that old, as above) and a redelivery converts the step.
      await ageClaim(bucket, Number(functionEnv.ORBAX2REG_CLAIM_LEASE_SECONDS ?? 600) + 1);
      expect(await finalized(bucket, marker)).toBe(204);
      const [converting] = await executionsOf(bucket);
      expect(converting).toBeDefined();
      await new Promise((r) => setTimeout(r, 2_500)); // the stopped one's answer is waiting in its socket by now

      process.kill(stopped.pid, "SIGCONT");
      expect(await delivery).toBe(204); // it saw the claim taken over and started nothing
      expect((await executionsOf(bucket)).map((e) => e.name)).toEqual([converting?.name]);
      expect(await claimOf(bucket)).toMatchObject({ execution: converting?.name });
      expect((await finished(converting as Execution)).state).toBe("SUCCEEDED");
      expect(readFileSync(join(work, "function-stopped.log"), "utf8")).toMatch(/taken over before this caller started an execution/);
    } finally {
      process.kill(stopped.pid, "SIGCONT");
      await stopped.stop();
    }
  });

  test("a function stopped past its own deadline between claiming and starting starts nothing, gives its claim back and fails", async () => {
    const bucket = await newBucket("train");
    const marker = (await writeCheckpoint(bucket)).at(-1) as string;
    await injectWorkflowsFaults(["late-answer:1"], "listExecutions");
    // A lease of 68 s is terraform's for an 8 s function timeout: the delivery's own deadline is 6 s.
    const log = join(work, "function-deadline.log");
    const stopped = await startFunction({ ...functionEnv, ORBAX2REG_CLAIM_LEASE_SECONDS: "68" }, log);
    try {
      const delivery = finalized(bucket, marker, stopped.url).catch(() => 0);
      await until(async () => (await exists(bucket, CLAIM)) && (await pendingWorkflowsFaults("listExecutions")).length === 0);
      process.kill(stopped.pid, "SIGSTOP");
      await new Promise((r) => setTimeout(r, 7_000)); // past its deadline, within its lease
      process.kill(stopped.pid, "SIGCONT");
      expect(await delivery).toBe(500); // for the platform to redeliver
      expect(await exists(bucket, CLAIM)).toBe(false);
      expect(await executionsOf(bucket)).toHaveLength(0);
      expect(readFileSync(log, "utf8")).toMatch(/deadline \(.*\) passed before it started an execution; claim released/);
    } finally {
      process.kill(stopped.pid, "SIGCONT");
      await stopped.stop();
    }
    expect(await finalized(bucket, marker)).toBe(204); // the redelivery
    const started = await executionsOf(bucket);
    expect(started).toHaveLength(1);
    expect((await finished(started[0] as Execution)).state).toBe("SUCCEEDED");
  });

  test("when Workflows creates the execution but the call fails, that execution is kept and no second one starts", async () => {
    const bucket = await newBucket("train");
    const marker = (await writeCheckpoint(bucket)).at(-1) as string;
    await injectWorkflowsFaults(["fail-after-create"]);
    expect(await finalized(bucket, marker)).toBe(204);
    expect(await finalized(bucket, marker)).toBe(204);
    const started = await executionsOf(bucket);
    expect(started).toHaveLength(1);
    expect(await claimOf(bucket)).toMatchObject({ execution: started[0]?.name });
    expect((await finished(started[0] as Execution)).state).toBe("SUCCEEDED");
  });

  test("the same event delivered 5 times at once starts exactly one execution", async () => {
    const bucket = await newBucket("train");
    const marker = (await writeCheckpoint(bucket)).at(-1) as string;
    const statuses = await Promise.all(Array.from({ length: 5 }, () => finalized(bucket, marker)));
    expect(statuses).toEqual([204, 204, 204, 204, 204]);
    const started = await executionsOf(bucket);
    expect(started).toHaveLength(1);
    expect((await finished(started[0] as Execution)).state).toBe("SUCCEEDED");
  });

  test("orbax2reg cloud check weighs the fan-out against the quota, waits for a young trigger, converts under a nested root, proves the executions filter, announces and verifies a bundled checkpoint, says the destination shares the watched bucket, then removes what it wrote", async () => {
    const bucket = await newBucket("deploy");
    const eventarc = eventarcStandIn(bucket, fnRuns.url);
    const topic = deployed.functionEnv.ORBAX2REG_EVENTS_TOPIC as string;
    // The Cloud Quotas API has no emulator: a stand-in answers with the documented QuotaInfo shape.
    const quotas = await startQuotaStandIn(PROJECT, [cpuQuota(100), memoryQuota(400)]);
    // Nor have Eventarc's and Pub/Sub's REST reads: a trigger created 110 s ago, so the check waits about 10 s for it.
    const trigger = `projects/${PROJECT}/locations/us-central1/triggers/orbax2reg-on-checkpoint-123456`;
    const subscription = `projects/${PROJECT}/subscriptions/eventarc-us-central1-orbax2reg-on-checkpoint-123456-sub-789`;
    const delivery = await startTriggerStandIn({
      trigger,
      subscription,
      createTime: new Date(Date.now() - 110_000).toISOString(),
      ackDeadlineSeconds: 600,
    });
    // A root two segments below the watched prefix runs/ (runs/team/orbax2reg-check-<random>): nested roots are what the
    // function's and the jobs' IAM conditions extract() the root from (terraform/README.md, "Where the jobs may write").
    const r = await runBinAsync(["cloud", "check", "--bucket", bucket, "--prefix", "runs/team", "--events-topic", topic], {
      ORBAX2REG_WORKFLOW: WORKFLOW,
      ORBAX2REG_WORKFLOWS_ENDPOINT: workflows.url,
      ORBAX2REG_CLOUDQUOTAS_ENDPOINT: quotas.url,
      ORBAX2REG_EVENT_TRIGGER: trigger,
      // The deployed function's lease, from which the check knows its timeout (terraform output claim_lease_seconds).
      ORBAX2REG_CLAIM_LEASE_SECONDS: deployed.functionEnv.ORBAX2REG_CLAIM_LEASE_SECONDS as string,
      ORBAX2REG_EVENTARC_ENDPOINT: delivery.url,
      ORBAX2REG_PUBSUB_REST_ENDPOINT: delivery.url,
    }).finally(async () => {
      await eventarc.stop();
      await quotas.close();
      await delivery.close();
    });
    expect(r.code, r.stdout + r.stderr).toBe(0);
    const stages = r.stdout.split("\n").filter((l) => /^(ok|FAIL) /.test(l));
    expect(stages.map((l) => l.split(/\s+/).slice(0, 2).join(" "))).toEqual([
      "ok access", // fake-gcs-server does not say; the check says so (test/cloud/ops/check-access.test.ts on the testbench)
      "ok quota",
      "ok delivery",
      "ok upload",
      "ok trigger",
      "ok filter",
      "ok convert",
      "ok event",
      "ok verify",
      "ok layout",
      "ok cleanup",
    ]);
    // Said before the wait, then in the stage's line.
    expect(r.stdout).toMatch(
      /delivery +the trigger orbax2reg-on-checkpoint-123456 was created 11\d s ago; .*up to two minutes to become operational: waiting \d+ s/,
    );
    expect(r.stdout).toMatch(
      /^ok +delivery .*waited \d+ s for it to be two minutes old; subscription eventarc-us-central1-orbax2reg-on-checkpoint-123456-sub-789: ack deadline 600 s, at least the function's timeout of 60 s/m,
    );
    expect(r.stdout).toMatch(new RegExp(`upload .* gs://${bucket}/runs/team/orbax2reg-check-[0-9a-f]{8}/step_00000100 `));
    expect(r.stdout).toMatch(
      /^ok +layout .*the destination shares the watched bucket .*: every object a conversion writes there is one more event for the function \(\d+ for this check's step/m,
    );
    expect(r.stdout).toMatch(
      /quota .* 8 groups at once x 1 task x 8 vCPU \/ 32 GiB = 64 vCPU, 256 GiB, and the function's 10 instances x 1 vCPU \/ 0.5 GiB = 10 vCPU, 5 GiB: 74 vCPU, 261 GiB; .*: fits/,
    );
    expect(r.stdout).toMatch(/filter .* a label value no execution has matched none; createTime>= before it kept it, after it dropped it/);
    expect(r.stdout).toMatch(/verify .* \d+ passed, 0 failed/);
    const [left] = await emulatorStorage().bucket(bucket).getFiles();
    expect(left.map((f) => f.name)).toEqual([]);
  });

  test("orbax2reg cloud check with hf_export also exports the bundled fuji example alone, finds export-hf's bytes and its export.succeeded, then removes it", async () => {
    const bucket = await newBucket("deploy");
    const eventarc = eventarcStandIn(bucket, fnRuns.url);
    const topic = deployed.functionEnv.ORBAX2REG_EVENTS_TOPIC as string;
    const quotas = await startQuotaStandIn(PROJECT, [cpuQuota(100), memoryQuota(400)]);
    const r = await runBinAsync(["cloud", "check", "--bucket", bucket, "--prefix", "runs", "--events-topic", topic], {
      ORBAX2REG_WORKFLOW: WORKFLOW,
      ORBAX2REG_WORKFLOWS_ENDPOINT: workflows.url,
      ORBAX2REG_CLOUDQUOTAS_ENDPOINT: quotas.url,
      // hf_export's template, as the function has it (terraform output hf_export_destination_template).
      ORBAX2REG_EXPORT_DESTINATION_TEMPLATE: "gs://{bucket}/{root}/hf/{step}",
    }).finally(async () => {
      await eventarc.stop();
      await quotas.close();
    });
    expect(r.code, r.stdout + r.stderr).toBe(0);
    const stages = r.stdout.split("\n").filter((l) => /^(ok|FAIL|skip) /.test(l));
    expect(stages.map((l) => l.split(/\s+/).slice(0, 2).join(" ")).slice(-4)).toEqual([
      "ok export",
      "ok export-event",
      "ok export-verify",
      "ok cleanup",
    ]);
    expect(r.stdout).toMatch(
      new RegExp(
        `^ok +export .*gs://${bucket}/runs/orbax2reg-check-[0-9a-f]{8}/step_00001000 \\(\\d+ objects, no commit marker\\) exported alone by .*: SUCCEEDED into gs://${bucket}/runs/orbax2reg-check-[0-9a-f]{8}/hf/step_00001000$`,
        "m",
      ),
    );
    expect(r.stdout).toMatch(/^ok +export-verify .*: byte for byte export-hf's of the same example$/m);
    expect(r.stdout).toMatch(/and exported one as export-hf does: deployment OK/);
    const [left] = await emulatorStorage().bucket(bucket).getFiles();
    expect(left.map((f) => f.name)).toEqual([]);
  });

  test("orbax2reg cloud check fails with one line naming the likely cause when no conversion starts", async () => {
    const bucket = await newBucket("deploy");
    const eventarc = eventarcStandIn(bucket, fnRuns.url); // watches runs/, not elsewhere/
    // A new project's quota: 20 vCPU in the region, less than the defaults' 64 + the function's 10.
    const quotas = await startQuotaStandIn(PROJECT, [cpuQuota(20), memoryQuota(400)]);
    const r = await runBinAsync(["cloud", "check", "--bucket", bucket, "--prefix", "elsewhere", "--timeout", "3"], {
      ORBAX2REG_WORKFLOW: WORKFLOW,
      ORBAX2REG_WORKFLOWS_ENDPOINT: workflows.url,
      ORBAX2REG_CLOUDQUOTAS_ENDPOINT: quotas.url,
    }).finally(async () => {
      await eventarc.stop();
      await quotas.close();
    });
    expect(r.code).toBe(4); // a check that found the deployment wanting, not a failure of the tool (1)
    expect(r.stdout).toMatch(/^FAIL quota .*does not fit \(CPU 74 vCPU > 20 vCPU\); set max_parallel_groups = 1 /m);
    expect(r.stdout).toMatch(/^FAIL trigger .*no execution .* is "elsewhere" one of checkpoint_prefixes/m);
    expect(r.stdout).toMatch(/^ok {3}cleanup/m);
  });

  test("events for chunk files, item-level markers and temporary directories start nothing", async () => {
    const bucket = await newBucket("train");
    // checkpoint_prefixes = ["runs"]: a step outside runs/ is not watched.
    expect(await finalizedName(bucket, "elsewhere/step_00000100/commit_success.txt", fnRuns.url)).toBe(204);
    for (const name of [
      `${STEP}/state/d/0123456789abcdef`,
      `${STEP}/state/commit_success.txt`,
      `${STEP}/state/manifest.ocdbt`,
      "runs/exp/step_00000200.orbax-checkpoint-tmp-1732900000/commit_success.txt",
    ]) {
      expect(await finalizedName(bucket, name)).toBe(204);
    }
    expect(await executionsOf(bucket)).toHaveLength(0);
    const [objects] = await emulatorStorage().bucket(bucket).getFiles();
    expect(objects).toHaveLength(0); // no claim either
  });
});
