// Runs workflows on the Workflows emulator (tools/workflows-emulator/wfemu.py) through its Executions REST API,
// for the tests in this directory.
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
