// The Cloud Function (2nd gen) behind the checkpoint bucket's finalize events. Thin: configuration comes
// from the environment (set by terraform), the decisions are in src/cloud/trigger-handler.ts.
import { type CloudEvent, cloudEvent } from "@google-cloud/functions-framework";
import { PubSub } from "@google-cloud/pubsub";
import { ExecutionsClient } from "@google-cloud/workflows";
import { eventAttributes } from "../src/cloud/events.js";
import { jsonLogger } from "../src/cloud/log.js";
import { handleFinalized, type TriggerDeps } from "../src/cloud/trigger-handler.js";
import { openStore } from "../src/store/open.js";

function env(name: string, fallback?: string): string {
  const v = process.env[name] ?? fallback;
  if (v === undefined || v === "") throw new Error(`environment variable ${name} is required`);
  return v;
}

/** A Workflows client; ORBAX2REG_WORKFLOWS_ENDPOINT (http://host:port) points it at a local emulator's REST API. */
async function workflowsClient(): Promise<ExecutionsClient> {
  const endpoint = process.env.ORBAX2REG_WORKFLOWS_ENDPOINT;
  if (!endpoint) return new ExecutionsClient();
  const url = new URL(endpoint);
  const { PassThroughClient } = await import("google-auth-library");
  return new ExecutionsClient({
    fallback: true,
    protocol: url.protocol.replace(":", ""),
    apiEndpoint: url.hostname,
    port: Number(url.port),
    authClient: new PassThroughClient(),
  } as unknown as ConstructorParameters<typeof ExecutionsClient>[0]);
}

let deps: Promise<TriggerDeps> | undefined;

function realDeps(): Promise<TriggerDeps> {
  deps ??= (async () => {
    const executions = await workflowsClient();
    const pubsub = new PubSub();
    return {
      config: {
        workflow: env("ORBAX2REG_WORKFLOW"),
        rootPrefixes: env("ORBAX2REG_ROOT_PREFIXES", "")
          .split(",")
          .map((p) => p.trim()),
        destinationTemplate: env("ORBAX2REG_DESTINATION_TEMPLATE", "gs://{bucket}/{root}/regular"),
        groups: Number(env("ORBAX2REG_GROUPS", "8")),
        eventsTopic: process.env.ORBAX2REG_EVENTS_TOPIC || undefined,
      },
      openStore,
      async startExecution(workflow, argument, labels) {
        const [execution] = await executions.createExecution({
          parent: workflow,
          execution: { argument: JSON.stringify(argument), labels },
        });
        return execution.name ?? "";
      },
      async publish(topic, event) {
        await pubsub.topic(topic).publishMessage({ json: event, attributes: eventAttributes(event) });
      },
      log: jsonLogger({ component: "orbax2reg-trigger" }),
    } satisfies TriggerDeps;
  })();
  return deps;
}

cloudEvent("onCheckpointFinalized", async (event: CloudEvent<unknown>) => {
  await handleFinalized({ id: event.id, data: event.data }, await realDeps());
});
