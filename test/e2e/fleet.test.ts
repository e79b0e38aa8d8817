import { appendFileSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, inject, test, vi } from "vitest";
import type { StepRow, StepStatus } from "../../src/cloud/ops/status.js";
import { CLAIM_KEY } from "../../src/convert/work-dir.js";
import { type CliResult, runBin, runBinAsync } from "../helpers/cli.js";
import { fixtureCase, removeScratch, scratch } from "../helpers/convert.js";
import { writeFaults } from "../helpers/faults-file.js";
import { emulatorStorage, newBucket, uploadDir } from "../helpers/gcs.js";
import type { Running } from "../helpers/servers.js";
import { type Deployed, deployedSettings } from "./deployed.js";
import { printLogsOnFailure, startDeployedWorkflow, startRunApi } from "./emulators.js";

// Each test waits on workflow retries with real backoff and several processes per job: ~10-25 s on an idle
// machine, up to 5x that when the 2 cores are shared (seen in the full suite). A deadline, not a timing check.
vi.setConfig({ testTimeout: 180_000 });

// `orbax2reg cloud status | start | backfill | cancel` against the pipeline on loopback: the real
// workflows/convert.yaml on the Workflows emulator, the job entry point as local processes
// (connector-hook.mjs), fake-gcs-server, and the Cloud Run Admin API stand-in (test/e2e/run-api.mjs) serving
// the job executions' status to @google-cloud/run. The CLI runs as the installed executable, configured as
// a user would: ORBAX2REG_WORKFLOW and ORBAX2REG_DESTINATION_TEMPLATE (what terraform deploys by default).

const tiny = fixtureCase("tiny");
const ROOT_PATH = "runs/exp";

let work: string;
let workflows: Running;
let runApi: Running;
let deployed: Deployed;
let cliEnv: NodeJS.ProcessEnv;

beforeAll(async () => {
  work = scratch("fleet");
  process.env.METADATA_SERVER_DETECTION = "none";
  // The regular checkpoints next to the Orbax ones (gs://<bucket>/<root>/regular), as `cloud status` finds them here.
  deployed = await deployedSettings({ project_id: "test-project", checkpoint_bucket: "ckpts", convert_into_checkpoint_bucket: true });
  const emulators = {
    ORBAX2REG_GCS_ENDPOINT: inject("gcsEndpoint"),
    GOOGLE_CLOUD_PROJECT: "test-project",
    METADATA_SERVER_DETECTION: "none",
  };
  writeFaults(join(work, "faults.json"), []);
  // Events are pipeline.test.ts's business: here they go to a file.
  workflows = await startDeployedWorkflow(work, deployed, { ...emulators, E2E_PUBSUB_LOG: join(work, "published.jsonl") });
  runApi = await startRunApi(join(work, "runs"), join(work, "run-api.log"));
  cliEnv = {
    ...emulators,
    ORBAX2REG_WORKFLOWS_ENDPOINT: workflows.url,
    ORBAX2REG_RUN_ENDPOINT: runApi.url,
    ORBAX2REG_WORKFLOW: deployed.functionEnv.ORBAX2REG_WORKFLOW,
    ORBAX2REG_DESTINATION_TEMPLATE: deployed.functionEnv.ORBAX2REG_DESTINATION_TEMPLATE,
    ORBAX2REG_GROUPS: deployed.workflowEnv.ORBAX2REG_GROUPS,
  };
}, 180_000);

// A failed test prints the end of what the pipeline logged, so that a failure seen once in CI can be read.
printLogsOnFailure(() => work, ["transcript.txt", "hooks.jsonl", "jobs.jsonl", "workflows.log", "run-api.log"]);

afterAll(async () => {
  await Promise.all([workflows?.stop(), runApi?.stop()]);
  removeScratch();
});

/** Runs `orbax2reg cloud ...`; every command and its output also go to transcript.txt (kept with ORBAX2REG_KEEP_SCRATCH=1). */
async function cloud(args: string[]): Promise<CliResult> {
  const r = await runBinAsync(["cloud", ...args], cliEnv);
  appendFileSync(join(work, "transcript.txt"), `$ orbax2reg cloud ${args.join(" ")}\n${r.stdout}${r.stderr}[exit ${r.code}]\n\n`);
  return r;
}
const stepDir = (step: number) => `step_${String(step).padStart(8, "0")}`;

/**
 * Uploads the tiny fixture (step 100) as step `step` under the root: AXLearn's index names its step, so that
 * is rewritten; the commit marker last, or not at all when `committed` is false.
 */
async function writeStep(bucket: string, step: number, committed = true): Promise<void> {
  const prefix = `${ROOT_PATH}/${stepDir(step)}`;
  const special = new Set(["commit_success.txt", "index/index"]);
  await uploadDir(tiny.location, bucket, prefix, (k) => special.has(k));
  const index = readFileSync(join(tiny.location, "index/index"), "utf8").replace('["step", 100]', `["step", ${step}]`);
  const b = emulatorStorage().bucket(bucket);
  await b.file(`${prefix}/index/index`).save(index, { resumable: false });
  if (committed)
    await b.file(`${prefix}/commit_success.txt`).save(readFileSync(join(tiny.location, "commit_success.txt")), { resumable: false });
}

async function status(bucket: string, step?: number): Promise<StepRow[]> {
  const r = await cloud(["status", `gs://${bucket}/${ROOT_PATH}`, "--json", ...(step === undefined ? [] : ["--step", String(step)])]);
  expect(r.stderr).toBe("");
  expect(r.code).toBe(0);
  return JSON.parse(r.stdout) as StepRow[];
}

async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 180_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs / 1000} s`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

const stateOf = async (bucket: string, step: number) => (await status(bucket, step))[0]?.status;
const settled = (bucket: string, step: number) =>
  until(`step ${step} settles`, async () => {
    const s = await stateOf(bucket, step);
    return s && s.state !== "running" && s.state !== "claimed" ? s : undefined;
  });

const faults = (list: unknown[]) => writeFaults(join(work, "faults.json"), list);
const destinationOf = (bucket: string) => `gs://${bucket}/${ROOT_PATH}/regular`;

// One root whose steps are in every state, built once; the tests below read it in order (the last two
// cancel and then resume step 200).
describe("orbax2reg cloud status and cancel", () => {
  let bucket = "";
  let running: StepStatus;
  let by: Map<number, StepStatus>;

  beforeAll(async () => {
    bucket = await newBucket("status");
    for (const step of [100, 200, 300, 400, 500, 600]) await writeStep(bucket, step);
    await writeStep(bucket, 700, false);
    faults([]);
    // 100 converts; 200 hangs in group 0 (running); 300's plan is refused (failed).
    expect((await cloud(["start", `gs://${bucket}/${ROOT_PATH}/${stepDir(100)}`])).code).toBe(0);
    expect(await settled(bucket, 100)).toMatchObject({ state: "converted" });
    faults([{ destination: destinationOf(bucket), group: 0, fault: "hang", times: 1 }]);
    expect((await cloud(["start", `gs://${bucket}/${ROOT_PATH}/${stepDir(200)}`])).code).toBe(0);
    running = await until("step 200 runs its groups", async () => {
      const s = await stateOf(bucket, 200);
      return s?.state === "running" && s.groups !== null && s.jobs.length > 0 ? s : undefined;
    });
    faults([{ destination: destinationOf(bucket), phase: "plan", fault: "http", code: 400 }]);
    expect((await cloud(["start", `gs://${bucket}/${ROOT_PATH}/${stepDir(300)}`])).code).toBe(0);
    expect(await settled(bucket, 300)).toMatchObject({ state: "failed", phase: null });
    faults([]);
    // 400: a claim that never started (its delivery is starting the execution right now).
    const claim = {
      source: `gs://${bucket}/${ROOT_PATH}/${stepDir(400)}`,
      step: 400,
      eventId: "e",
      claimedAt: new Date().toISOString(),
      execution: null,
    };
    await emulatorStorage()
      .bucket(bucket)
      .file(`${ROOT_PATH}/regular/${stepDir(400)}/${CLAIM_KEY}`)
      .save(JSON.stringify(claim), { resumable: false });
    by = new Map((await status(bucket)).map((r) => [r.step, r.status]));
  }, 300_000);

  test("names every state a step can be in: converted, running, failed, claimed, not converted", () => {
    expect(by.get(100)).toMatchObject({ state: "converted", execution: expect.stringContaining("/executions/") });
    expect((by.get(100) as { bytes: number }).bytes).toBeGreaterThan(0);
    expect(running).toMatchObject({ state: "running", groups: Number(cliEnv.ORBAX2REG_GROUPS) });
    expect((running as Extract<StepStatus, { state: "running" }>).jobs[0]).toMatchObject({ taskCount: 1, running: 1, done: false });
    // A 400 refusal fails the same way until someone redeploys: running it again cannot help.
    expect(by.get(300)).toMatchObject({ state: "failed", retryable: false, error: expect.stringMatching(/plan could not be started/) });
    expect(by.get(400)).toMatchObject({ state: "claimed", expired: false });
    expect(by.get(500)).toMatchObject({ state: "not-converted", committed: true, reason: "never started" });
    expect(by.get(700)).toMatchObject({ state: "not-converted", committed: false });
  });

  test("prints a table a person reads: one line per step", async () => {
    const table = await cloud(["status", `gs://${bucket}/${ROOT_PATH}`]);
    expect(table.stdout).toMatch(/^STEP\s+STATE\s+DETAIL$/m);
    expect(table.stdout).toMatch(/^\s*100\s+converted\s+/m);
    expect(table.stdout).toMatch(/^\s*200\s+running\s+groups \d+\/\d+, /m);
  }, 60_000);

  test("cancel stops a running step's execution and its job, leaves no index, and status says cancelled", async () => {
    const cancel = await cloud(["cancel", `gs://${bucket}/${ROOT_PATH}`, "--step", "200"]);
    expect(cancel.code).toBe(0);
    expect(cancel.stdout).toMatch(/cancelled projects\/.*\/executions\//);
    expect(cancel.stdout).toMatch(/cancelled job execution projects\/.*\/jobs\/orbax2reg-convert-group\/executions\//);
    expect(await stateOf(bucket, 200)).toMatchObject({ state: "cancelled" });
    const [indexExists] = await emulatorStorage()
      .bucket(bucket)
      .file(`${ROOT_PATH}/regular/${stepDir(200)}/index`)
      .exists();
    expect(indexExists).toBe(false);
  }, 120_000);

  test("a later start resumes a cancelled step from its plan, and the result verifies", async () => {
    const again = await cloud(["start", `gs://${bucket}/${ROOT_PATH}/${stepDir(200)}`]);
    expect(again.code).toBe(0);
    const resumed = (await settled(bucket, 200)) as Extract<StepStatus, { state: "converted" }>;
    expect(resumed).toMatchObject({ state: "converted" });
    // The new execution reused the cancelled one's plan, and its groups skipped what was already written.
    const execution = (await (await fetch(`${workflows.url}/v1/${resumed.execution}`)).json()) as { result: string };
    expect(JSON.parse(execution.result)).toMatchObject({ resumed: true, already_converted: false });
    const verified = runBin(["verify", `gs://${bucket}/${ROOT_PATH}/${stepDir(200)}`, `${destinationOf(bucket)}/${stepDir(200)}`], cliEnv);
    expect(verified.stdout).toMatch(/ 0 failed/);
    expect(verified.code).toBe(0);
  }, 300_000);
});

describe("orbax2reg cloud start", () => {
  test("refuses a second conversion of a step whose conversion is running, naming the execution", async () => {
    const bucket = await newBucket("start");
    await writeStep(bucket, 100);
    faults([{ destination: destinationOf(bucket), group: 0, fault: "hang", times: 1 }]);
    const first = await cloud(["start", `gs://${bucket}/${ROOT_PATH}/${stepDir(100)}`, "--json"]);
    expect(first.code).toBe(0);
    const started = JSON.parse(first.stdout) as { outcome: string; execution: string; argument: Record<string, unknown> };
    expect(started).toMatchObject({ outcome: "started", argument: { step: 100, destination: destinationOf(bucket) } });
    const second = await cloud(["start", `gs://${bucket}/${ROOT_PATH}/${stepDir(100)}`]);
    expect(second.code).toBe(2);
    expect(second.stderr).toContain(`is being converted by ${started.execution}`);
    expect((await cloud(["cancel", `gs://${bucket}/${ROOT_PATH}`, "--step", "100"])).code).toBe(0);
    faults([]);
  }, 180_000);

  test("an uncommitted or malformed step directory is refused before anything starts", async () => {
    const r = await cloud(["start", "gs://bucket/runs/exp/not-a-step"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/expected gs:\/\/BUCKET\/PATH\/step_XXXXXXXX/);
  });
});

describe("orbax2reg cloud backfill", () => {
  test("starts the committed steps that are neither converted nor claimed, --every and --max-running respected", async () => {
    const bucket = await newBucket("backfill");
    for (const step of [100, 200, 300, 400, 500, 600]) await writeStep(bucket, step);
    await writeStep(bucket, 700, false);
    // Two converted already (by the CLI on one machine: the pipeline reads the same format).
    for (const step of [200, 400]) {
      const r = runBin(["convert", `gs://${bucket}/${ROOT_PATH}/${stepDir(step)}`, destinationOf(bucket)], cliEnv);
      expect(r.code).toBe(0);
    }
    const root = `gs://${bucket}/${ROOT_PATH}`;

    const dry = await cloud(["backfill", root, "--dry-run", "--json"]);
    expect(dry.code).toBe(0);
    const planned = JSON.parse(dry.stdout) as { step: number; action: string; why: string }[];
    expect(planned.filter((e) => e.action === "would-start").map((e) => e.step)).toEqual([100, 300, 500, 600]);
    expect(planned.find((e) => e.step === 200)).toMatchObject({ action: "skipped", why: "converted" });
    expect(planned.find((e) => e.step === 700)).toMatchObject({ action: "skipped", why: "the Orbax step is not committed" });

    // The same for a person: one line per step, then the counts.
    const text = await cloud(["backfill", root, "--dry-run"]);
    expect(text.stdout).toMatch(/^\s+100 {2}would-start {2}not converted$/m);
    expect(text.stdout).toMatch(/^\s+700 {2}skipped {6}the Orbax step is not committed$/m);
    expect(text.stdout).toMatch(/^4 would start, 3 skipped$/m);

    const every = await cloud(["backfill", root, "--every", "300", "--dry-run", "--json"]);
    expect(
      (JSON.parse(every.stdout) as { step: number; action: string }[]).filter((e) => e.action === "would-start").map((e) => e.step),
    ).toEqual([300, 600]);

    const run = await cloud(["backfill", root, "--max-running", "1", "--poll", "1", "--json"]);
    expect(run.code).toBe(0);
    const started = (JSON.parse(run.stdout) as { step: number; action: string }[]).filter((e) => e.action === "started").map((e) => e.step);
    expect(started).toEqual([100, 300, 500, 600]);
    for (const step of started) expect(await settled(bucket, step)).toMatchObject({ state: "converted" });
    // With --max-running 1, each started only after the one before had finished.
    const listed = (await (await fetch(`${workflows.url}/v1/${cliEnv.ORBAX2REG_WORKFLOW}/executions?view=FULL`)).json()) as {
      executions: { argument: string; startTime: string; endTime: string }[];
    };
    const ours = listed.executions
      .filter((e) => (JSON.parse(e.argument) as { source: string }).source.startsWith(`gs://${bucket}/`))
      .sort((a, b) => a.startTime.localeCompare(b.startTime));
    expect(ours).toHaveLength(4);
    for (let i = 1; i < ours.length; i++) expect((ours[i]?.startTime ?? "") >= (ours[i - 1]?.endTime ?? "~")).toBe(true);
    const again = await cloud(["backfill", root, "--dry-run", "--json"]);
    expect((JSON.parse(again.stdout) as { action: string }[]).filter((e) => e.action === "would-start")).toEqual([]);
  }, 300_000);
});
