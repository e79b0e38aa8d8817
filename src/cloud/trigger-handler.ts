import { stepDirName } from "../convert/plan.js";
import { CLAIM_KEY } from "../convert/plan-format.js";
import type { Store } from "../store/store.js";
import type { ConversionEvent } from "./events.js";
import type { Logger } from "./log.js";
import { classify, type TriggerConfig } from "./trigger.js";

export interface TriggerHandlerConfig extends TriggerConfig {
  /** Full workflow id: projects/P/locations/L/workflows/W. */
  readonly workflow: string;
  readonly groups: number;
  /** Topic for conversion events; none means no events. */
  readonly eventsTopic: string | undefined;
}

/** The outside world, injected so the cloud function stays thin and the logic testable. */
export interface TriggerDeps {
  readonly config: TriggerHandlerConfig;
  openStore(location: string): Promise<Store>;
  /** Starts a workflow execution; returns its name. */
  startExecution(workflow: string, argument: WorkflowArgument, labels: Record<string, string>): Promise<string>;
  publish(topic: string, event: ConversionEvent): Promise<void>;
  readonly log: Logger;
}

/** The workflow's documented argument (workflows/convert.yaml). */
export interface WorkflowArgument {
  readonly source: string;
  readonly destination: string;
  readonly step: number;
  readonly groups: number;
}

export type TriggerOutcome = "ignored" | "waiting" | "duplicate" | "started";

/**
 * Handles one `google.cloud.storage.object.v1.finalized` event: decides whether it commits an Orbax step,
 * claims the step exactly once (a create-if-absent object in the destination), starts the workflow and
 * publishes `conversion.requested`. Malformed events are logged and acknowledged; transient failures
 * throw so the platform retries (the claim is released first so the retry can take it).
 */
export async function handleFinalized(event: { id?: string; data?: unknown }, deps: TriggerDeps): Promise<TriggerOutcome> {
  const data = event.data as { bucket?: unknown; name?: unknown } | undefined;
  if (typeof data?.bucket !== "string" || typeof data?.name !== "string") {
    deps.log.warn("malformed storage event ignored", { eventId: event.id ?? null });
    return "ignored";
  }
  const decision = classify(data.bucket, data.name, deps.config);
  if (decision.kind === "ignore") return "ignored";
  const log = deps.log.with({ step: decision.step, source: decision.source, eventId: event.id ?? null });

  if (decision.requires) {
    const other = await deps.openStore(`gs://${decision.requires.bucket}`);
    if ((await other.stat(decision.requires.name)) === undefined) {
      log.info("waiting for the other half of the emergency checkpoint", { requires: decision.requires.name });
      return "waiting";
    }
  }

  const destination = await deps.openStore(decision.destination);
  const claimKey = `${stepDirName(decision.step)}/${CLAIM_KEY}`;
  const claim = {
    source: decision.source,
    step: decision.step,
    eventId: event.id ?? null,
    claimedAt: new Date().toISOString(),
    execution: null as string | null,
  };
  if (!(await destination.createExclusive(claimKey, encode(claim)))) {
    log.info("step already claimed; duplicate event ignored", { claim: `${decision.destination}/${claimKey}` });
    return "duplicate";
  }
  const argument: WorkflowArgument = {
    source: decision.source,
    destination: decision.destination,
    step: decision.step,
    groups: deps.config.groups,
  };
  let execution: string;
  try {
    execution = await deps.startExecution(deps.config.workflow, argument, { step: String(decision.step) });
  } catch (e) {
    await destination.delete(claimKey);
    throw e;
  }
  await destination.write(claimKey, encode({ ...claim, execution }));
  log.info("conversion started", { execution, destination: decision.destination });
  if (deps.config.eventsTopic) {
    await deps.publish(deps.config.eventsTopic, {
      type: "conversion.requested",
      source: decision.source,
      destination: decision.destination,
      step: decision.step,
      execution,
      arrays: null,
      bytes: null,
      duration: null,
      error: null,
      time: new Date().toISOString(),
    });
  }
  return "started";
}

function encode(v: unknown): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(v));
}
