// Runs workflows on the Workflows emulator (tools/workflows-emulator/wfemu.py) through its Executions REST API,
// for the tests in this directory.
import { existsSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, inject } from "vitest";
import { deployedSettings } from "../e2e/deployed.js";
import { startWorkflows } from "../e2e/emulators.js";
import { removeScratch, scratch } from "../helpers/convert.js";
import { writeFaults } from "../helpers/faults-file.js";
import { newBucket, uploadDir } from "../helpers/gcs.js";
import type { Running } from "../helpers/servers.js";

export const PROJECT = "test-project";
export const LOCATION = "us-central1";

export interface Finished {
  readonly name: string;
  readonly state: "SUCCEEDED" | "FAILED" | "CANCELLED";
  /** The result (SUCCEEDED) or the error map (FAILED), parsed. */
  readonly result?: unknown;
  readonly error?: { message?: string; tags?: string[]; [k: string]: unknown };
}

/** Starts an execution of workflow `id` and waits (at most `timeoutMs`) until it is no longer ACTIVE. */
export async function runWorkflow(emulator: Running, id: string, argument: unknown = {}, timeoutMs = 120_000): Promise<Finished> {
  const parent = `${emulator.url}/v1/projects/${PROJECT}/locations/${LOCATION}/workflows/${id}/executions`;
  const created = await fetch(parent, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ argument: JSON.stringify(argument) }),
  });
  if (!created.ok) throw new Error(`create ${id}: HTTP ${created.status} ${await created.text()}`);
  const { name } = (await created.json()) as { name: string };
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const e = (await (await fetch(`${emulator.url}/v1/${name}`)).json()) as {
      state: string;
      result?: string;
      error?: { payload?: string };
    };
    if (e.state !== "ACTIVE") {
      return {
        name,
        state: e.state as Finished["state"],
        ...(e.result !== undefined ? { result: JSON.parse(e.result) } : {}),
        ...(e.error?.payload !== undefined ? { error: JSON.parse(e.error.payload) } : {}),
      };
    }
    if (Date.now() > deadline) throw new Error(`${name} still ACTIVE after ${timeoutMs / 1000} s`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

export interface ConvertWorkflowOptions {
  readonly groups: number;
  /** Where conversion events go (they are appended to `work`/events.jsonl); none: no events. */
  readonly eventsTopic?: string;
  /** More of the hook's environment (E2E_HANG_LIMIT_MS, E2E_POLL_HOLD_MS...). */
  readonly env?: Readonly<Record<string, string>>;
  /** More emulator options (--fast-clock...). */
  readonly args?: readonly string[];
  /** The emulator's log, in `work` (default workflows.log). */
  readonly log?: string;
}

/**
 * workflows/convert.yaml on the emulator with the user_env_vars terraform deploys (evaluated from terraform/ by
 * test/e2e/deployed.ts, never retyped: `groups` and at most 3 groups in parallel set in the module block; only
 * the events topic is the test's own, or none), its connector calls played by test/e2e/connector-hook.mjs: real
 * job processes against fake-gcs-server. The hook's logs (hooks.jsonl, jobs.jsonl) and the faults file it
 * reads on every call (faults.json) are in `work`.
 */
export async function startConvertWorkflow(work: string, o: ConvertWorkflowOptions): Promise<Running> {
  const deployed = await deployedSettings(
    { project_id: PROJECT, region: LOCATION, checkpoint_bucket: "ckpts" },
    { groups: o.groups, max_parallel_groups: 3 },
  );
  return startWorkflows(
    {
      workflowsDir: "workflows",
      hooks: resolve("test/e2e/hooks.yaml"),
      userEnv: { ...deployed.workflowEnv, ORBAX2REG_EVENTS_TOPIC: o.eventsTopic ?? "" },
      env: {
        ORBAX2REG_GCS_ENDPOINT: inject("gcsEndpoint"),
        E2E_HOOK_LOG: join(work, "hooks.jsonl"),
        E2E_JOB_LOG: join(work, "jobs.jsonl"),
        E2E_FAULTS: join(work, "faults.json"),
        // Cloud Run runs a task that exits non-zero again, up to the jobs' max_retries (jobs.tf).
        E2E_TASK_MAX_RETRIES: String(deployed.jobMaxRetries),
        ...(o.eventsTopic ? { E2E_PUBSUB_LOG: join(work, "events.jsonl") } : {}),
        ...o.env,
      },
      ...(o.args ? { args: o.args } : {}),
    },
    join(work, o.log ?? "workflows.log"),
  );
}

/** A test file's own convert.yaml on the emulator (convertWorkflowSuite), and what its tests read and stage. */
export interface ConvertWorkflowSuite {
  /** The emulator, once the file's beforeAll has started it. */
  readonly emulator: Running;
  /** A file of the suite's scratch directory (the hook's logs, faults.json). */
  file(name: string): string;
  /** The records appended to a JSON-lines log of the scratch directory (hooks.jsonl, events.jsonl): none before the first. */
  lines<T>(name: string): T[];
  /**
   * A new bucket (named `prefix`-<random>) holding the checkpoint step `checkpoint` at `step`, the destination
   * gs://<bucket>/runs/exp/regular, the workflow's argument converting one into the other, and the faults the hook
   * injects from now on (faults.json), given that destination.
   */
  stage(
    prefix: string,
    checkpoint: string,
    step: string,
    faults?: (destination: string) => unknown[],
  ): Promise<{ bucket: string; destination: string; argument: { source: string; destination: string } }>;
}

/**
 * startConvertWorkflow in a scratch directory of `label`, started before the file's tests and stopped (the
 * directory removed) after them. Call it at the top of a test file.
 */
export function convertWorkflowSuite(label: string, o: ConvertWorkflowOptions, startTimeoutMs = 60_000): ConvertWorkflowSuite {
  let work = "";
  let started: Running | undefined;
  beforeAll(async () => {
    work = scratch(label);
    started = await startConvertWorkflow(work, o);
  }, startTimeoutMs);
  afterAll(async () => {
    await started?.stop();
    removeScratch();
  });
  // One object for the whole file (its tests take it before beforeAll has run): each use goes to the running emulator.
  const emulator = new Proxy({} as Running, {
    get(_, key) {
      if (started === undefined) throw new Error("the emulator starts in beforeAll: use it in a test or a later hook");
      const v = Reflect.get(started, key);
      return typeof v === "function" ? v.bind(started) : v;
    },
  });
  const file = (name: string) => join(work, name);
  return {
    emulator,
    file,
    lines: <T>(name: string): T[] =>
      existsSync(file(name))
        ? readFileSync(file(name), "utf8")
            .split("\n")
            .filter(Boolean)
            .map((l) => JSON.parse(l) as T)
        : [],
    async stage(prefix, checkpoint, step, faults = () => []) {
      const bucket = await newBucket(prefix);
      await uploadDir(checkpoint, bucket, step);
      const destination = `gs://${bucket}/runs/exp/regular`;
      writeFaults(file("faults.json"), faults(destination));
      return { bucket, destination, argument: { source: `gs://${bucket}/${step}`, destination } };
    },
  };
}
