import type { Store } from "../../store/store.js";
import type { ConversionEvent } from "../api/events.js";
import { type Executions, executionLabels, type WorkflowArgument } from "../api/executions.js";
import type { Logger } from "../api/log.js";
import { classify } from "./classify.js";
import { deliveryDeadlineMs, type TriggerHandlerConfig } from "./config.js";
import { startOnce } from "./start.js";

export { ClaimBusyError, DeadlineError } from "../../errors.js";
export type { WorkflowArgument } from "../api/executions.js";

/** The outside world, injected so the cloud function stays thin and the logic testable. */
export interface TriggerDeps {
  readonly config: TriggerHandlerConfig;
  openStore(location: string): Promise<Store>;
  readonly executions: Executions;
  publish(topic: string, event: ConversionEvent): Promise<void>;
  readonly log: Logger;
  /** Clock and sleep, replaceable in tests. */
  readonly now?: () => number;
  readonly sleep?: (ms: number) => Promise<void>;
  /**
   * How long a delivery waits for a concurrent one that holds a fresh claim to record its execution,
   * before failing so that the platform redelivers later. Well inside the function's timeout.
   */
  readonly waitForPeerMs?: number;
}

/**
 * ignored: not a commit marker we watch; waiting: the other half of an emergency step is missing;
 * duplicate: the step's claim names an execution already; adopted: an execution for the step existed
 * (started by a delivery that died or saw an error) and is now recorded; started: this delivery started it;
 * refused: the Workflows API refused the request itself (logged at ERROR; redelivery cannot help).
 */
export type TriggerOutcome = "ignored" | "waiting" | "duplicate" | "adopted" | "started" | "refused";

/**
 * Handles one `google.cloud.storage.object.v1.finalized` event: decides whether it commits an Orbax step,
 * makes sure exactly one workflow execution converts that step, and publishes `conversion.requested`.
 *
 * Delivery is at least once and a function may die between any two lines, or see an error from a call
 * that succeeded; a failed invocation is redelivered with backoff for up to 24 hours
 * (https://cloud.google.com/eventarc/docs/retry-events). So starting goes through the step's claim and the
 * executions' labels (src/cloud/trigger/start.ts). Malformed events are acknowledged; what this throws is
 * redelivered if classify() (src/errors.ts) calls it retryable, and otherwise logged and acknowledged
 * (functions/index.ts).
 */
export async function handleFinalized(event: { id?: string; data?: unknown }, deps: TriggerDeps): Promise<TriggerOutcome> {
  const now = deps.now ?? Date.now;
  // This delivery's own deadline, from its first line: a throttled instance that resumes late starts nothing.
  const deadline = now() + (deps.config.deliveryDeadlineMs ?? deliveryDeadlineMs(deps.config.claimLeaseMs));
  const data = event.data as { bucket?: unknown; name?: unknown } | undefined;
  if (typeof data?.bucket !== "string" || typeof data?.name !== "string") {
    // Not what Eventarc sends for a Cloud Storage object: nothing can be made of it, so it is dropped (ERROR: alerted).
    deps.log.error("malformed storage event dropped: no bucket and object name in its data", { eventId: event.id ?? null });
    return "ignored";
  }
  const { config } = deps;
  const decision = classify(data.bucket, data.name, config);
  if (decision.kind === "ignore") return "ignored";
  const log = deps.log.with({ step: decision.step, source: decision.source, eventId: event.id ?? null });

  if (decision.requires) {
    const other = await deps.openStore(`gs://${decision.requires.bucket}`);
    if ((await other.stat(decision.requires.name)) === undefined) {
      log.info("waiting for the other half of the emergency checkpoint", { requires: decision.requires.name });
      return "waiting";
    }
  }

  const argument: WorkflowArgument = {
    source: decision.source,
    destination: decision.destination,
    step: decision.step,
    groups: config.groups,
    ...(decision.convert ? {} : { convert: false }),
    ...(decision.exportTo === undefined ? {} : { export: { ...config.exportSettings, destination: decision.exportTo } }),
  };
  const outcome = await startOnce(
    { argument, eventId: event.id ?? null, adoptFinished: true },
    {
      workflow: config.workflow,
      claimLeaseMs: config.claimLeaseMs,
      openStore: deps.openStore,
      executions: deps.executions,
      log,
      now,
      deadline,
      ...(deps.sleep ? { sleep: deps.sleep } : {}),
      ...(deps.waitForPeerMs !== undefined ? { waitForPeerMs: deps.waitForPeerMs } : {}),
    },
  );
  if (outcome.kind === "refused") {
    // Redelivery cannot fix a refused request: acknowledge, loudly. `orbax2reg cloud start` can retry later.
    log.error(`the workflow refused to start: ${outcome.message}`, { workflow: config.workflow, argument });
    return "refused";
  }
  if (outcome.kind !== "started") return outcome.kind;
  const execution = outcome.execution;
  const labels = executionLabels(decision.source, decision.step);
  log.info("conversion started", { execution, destination: decision.destination, labels });
  if (config.eventsTopic) {
    try {
      await deps.publish(config.eventsTopic, {
        type: "conversion.requested",
        source: decision.source,
        destination: decision.destination,
        step: decision.step,
        execution,
        arrays: null,
        bytes: null,
        duration: null,
        error: null,
        time: new Date(now()).toISOString(),
      });
    } catch (e) {
      // The conversion runs either way; a redelivery would only see the claim and stop. A WARNING: the function's
      // ERROR lines mean a dropped event (src/cloud/trigger/severity.ts), and this one was not.
      log.warn("could not publish conversion.requested", { execution, error: (e as Error).message });
    }
  }
  return "started";
}
