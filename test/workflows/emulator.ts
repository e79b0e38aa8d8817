// Runs workflows on the Workflows emulator (tools/workflows-emulator/wfemu.py) through its Executions REST API,
// for the tests in this directory.
import { join, resolve } from "node:path";
import { inject } from "vitest";
import { deployedSettings } from "../e2e/deployed.js";
import { startWorkflows } from "../e2e/emulators.js";
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
