// The deployed pipeline on loopback, as the end-to-end tests start it (pipeline.test.ts for conversions,
// export-pipeline.test.ts for Hugging Face exports): the Pub/Sub emulator with a subscription on the events topic,
// the Workflows emulator running workflows/convert.yaml with the jobs as local processes (connector-hook.mjs), the
// trigger function under the real functions-framework, and an Executions API client; plus what the tests do with
// them (deliver a commit event as Eventarc does, find and wait for executions, read the hooks' and jobs' logs).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { PubSub } from "@google-cloud/pubsub";
import { ExecutionsClient, type protos } from "@google-cloud/workflows";
import { PassThroughClient } from "google-auth-library";
import { inject } from "vitest";
import type { ConversionEvent } from "../../src/cloud/api/events.js";
import { writeFaults } from "../helpers/faults-file.js";
import { emulatorStorage } from "../helpers/gcs.js";
import type { Running } from "../helpers/servers.js";
import type { Deployed } from "./deployed.js";
import { startDeployedWorkflow, startFunction, startPubsub } from "./emulators.js";

export type Execution = protos.google.cloud.workflows.executions.v1.IExecution;

export const PROJECT = "test-project";

/** A line of connector-hook.mjs's log (hooks.jsonl): one connector call, task attempt or execution event. */
export interface HookCall {
  connector: string;
  phase?: string;
  job?: string;
  group?: string | null;
  destination?: string;
  taskCount?: number;
  task?: number;
  attempt?: number;
  code?: number;
}

export interface Pipeline {
  readonly work: string;
  readonly deployed: Deployed;
  readonly workflows: Running;
  /** The function as deployed (deployed.functionEnv), pointed at the emulators. */
  readonly fn: Running;
  /** The function's environment as `fn` runs it: deployed, plus where the emulators listen. */
  readonly functionEnv: NodeJS.ProcessEnv;
  /** The emulators' endpoints, for another function a test starts (with another deployment's environment). */
  readonly endpoints: NodeJS.ProcessEnv;
  readonly executions: ExecutionsClient;
  /** Every event published on the events topic, in the order received. */
  readonly events: { attributes: Record<string, string>; event: ConversionEvent }[];
  /** POSTs a google.cloud.storage.object.v1.finalized CloudEvent (binary mode), as Eventarc does; the status. */
  deliver(data: { bucket: string; name: string; generation?: unknown }, url?: string): Promise<number>;
  /** The event for an object in the bucket, with its real metadata. */
  finalized(bucket: string, name: string, url?: string): Promise<number>;
  /** The executions whose argument's source is in `bucket`. */
  executionsOf(bucket: string): Promise<Execution[]>;
  startByHand(argument: unknown): Promise<Execution>;
  /** Waits for an execution to end (fails after `timeoutMs`). */
  finished(execution: Execution, timeoutMs?: number): Promise<Execution>;
  /** The events of `type` for `destination`, once `count` of them have arrived (or after 10 s). */
  eventsFor(destination: string, type: ConversionEvent["type"], count?: number): Promise<Pipeline["events"]>;
  /** The hook's calls for a destination (the argument's: an export's calls name the conversion's destination). */
  hookCalls(destination: string): HookCall[];
  /** The jobs' JSON log lines. */
  jobLines(): Record<string, unknown>[];
  /** Replaces the hook's faults (connector-hook.mjs, E2E_FAULTS). */
  setFaults(faults: unknown[]): void;
  stop(): Promise<void>;
}

/**
 * Starts the pipeline `deployed` describes on the emulators, its logs in `work` (pubsub.log, workflows.log,
 * function.log, hooks.jsonl, jobs.jsonl). `subscription` names the test's subscription on the events topic.
 */
export async function startPipeline(work: string, deployed: Deployed, subscription = "e2e-all"): Promise<Pipeline> {
  // No metadata server on loopback: keep the Google clients from probing for one (and warning).
  process.env.METADATA_SERVER_DETECTION = "none";
  const pubsub = await startPubsub(join(work, "pubsub.log"));
  process.env.PUBSUB_EMULATOR_HOST = `127.0.0.1:${pubsub.port}`;
  const events: Pipeline["events"] = [];
  const [topic] = await new PubSub({ projectId: PROJECT }).createTopic(deployed.functionEnv.ORBAX2REG_EVENTS_TOPIC as string);
  const [sub] = await topic.createSubscription(subscription);
  sub.on("message", (m) => {
    events.push({ attributes: m.attributes, event: JSON.parse(m.data.toString()) });
    m.ack();
  });
  const emulators = {
    ORBAX2REG_GCS_ENDPOINT: inject("gcsEndpoint"),
    PUBSUB_EMULATOR_HOST: `127.0.0.1:${pubsub.port}`,
    GOOGLE_CLOUD_PROJECT: PROJECT,
    METADATA_SERVER_DETECTION: "none",
  };
  const faultsFile = join(work, "faults.json");
  const setFaults = (faults: unknown[]) => writeFaults(faultsFile, faults);
  setFaults([]);
  const workflows = await startDeployedWorkflow(work, deployed, emulators);
  const endpoints = { ...emulators, ORBAX2REG_WORKFLOWS_ENDPOINT: workflows.url };
  const functionEnv = { ...deployed.functionEnv, ...endpoints };
  const fn = await startFunction(functionEnv, join(work, "function.log"));
  const executions = new ExecutionsClient({
    fallback: true,
    protocol: "http",
    apiEndpoint: "127.0.0.1",
    port: workflows.port,
    authClient: new PassThroughClient(),
  } as unknown as ConstructorParameters<typeof ExecutionsClient>[0]);
  const workflow = deployed.functionEnv.ORBAX2REG_WORKFLOW as string;

  const deliver: Pipeline["deliver"] = async (data, url = fn.url) => {
    const response = await fetch(url, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        "ce-specversion": "1.0",
        "ce-id": `${data.name}#${data.generation}`,
        "ce-type": "google.cloud.storage.object.v1.finalized",
        "ce-source": `//storage.googleapis.com/projects/_/buckets/${data.bucket}`,
        "ce-subject": `objects/${data.name}`,
        "ce-time": new Date().toISOString(),
      },
      body: JSON.stringify(data),
    });
    return response.status;
  };
  const lines = (name: string) =>
    readFileSync(join(work, name), "utf8")
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l));

  return {
    work,
    deployed,
    workflows,
    fn,
    functionEnv,
    endpoints,
    executions,
    events,
    deliver,
    async finalized(bucket, name, url = fn.url) {
      const [metadata] = await emulatorStorage().bucket(bucket).file(name).getMetadata();
      return deliver({ ...metadata, bucket, name }, url);
    },
    async executionsOf(bucket) {
      // FULL: the listing's default BASIC view has no argument (every page: the client follows the page tokens).
      const [all] = await executions.listExecutions({ parent: workflow, view: "FULL" });
      return all.filter((e) => (JSON.parse(e.argument ?? "{}").source as string | undefined)?.startsWith(`gs://${bucket}/`));
    },
    async startByHand(argument) {
      const [created] = await executions.createExecution({ parent: workflow, execution: { argument: JSON.stringify(argument) } });
      return created;
    },
    async finished(execution, timeoutMs = 120_000) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const [e] = await executions.getExecution({ name: execution.name as string });
        if (e.state !== "ACTIVE") return e;
        if (Date.now() > deadline) throw new Error(`${execution.name} still ACTIVE after ${timeoutMs / 1000} s`);
        await new Promise((r) => setTimeout(r, 200));
      }
    },
    async eventsFor(destination, type, count = 1) {
      const deadline = Date.now() + 10_000;
      for (;;) {
        const found = events.filter((e) => e.event.destination === destination && e.event.type === type);
        if (found.length >= count || Date.now() > deadline) return found;
        await new Promise((r) => setTimeout(r, 100));
      }
    },
    hookCalls: (destination) => (lines("hooks.jsonl") as HookCall[]).filter((c) => c.destination === destination),
    jobLines: () => lines("jobs.jsonl"),
    setFaults,
    async stop() {
      await sub.close();
      await Promise.all([fn.stop(), workflows.stop(), pubsub.stop()]);
    },
  };
}
