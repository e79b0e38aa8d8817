import { stepDirName } from "../convert/plan.js";
import type { Store } from "../store/store.js";
import { type ClaimRecord, StepClaim } from "./claim.js";
import type { ConversionEvent } from "./events.js";
import { type ExecutionRef, type Executions, executionLabels, isPermanentApiError, type WorkflowArgument } from "./executions.js";
import type { Logger } from "./log.js";
import { classify } from "./trigger.js";
import type { TriggerHandlerConfig } from "./trigger-config.js";

export type { WorkflowArgument } from "./executions.js";

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

/** A fresh claim held by another delivery that has not recorded an execution yet: retry later. */
export class ClaimBusyError extends Error {
  override readonly name = "ClaimBusyError";
}

/** Executions created this long before a claim's time still count as that claim's (clock skew between instances). */
const CLOCK_SKEW_MS = 60_000;

/**
 * Handles one `google.cloud.storage.object.v1.finalized` event: decides whether it commits an Orbax step,
 * makes sure exactly one workflow execution converts that step, and publishes `conversion.requested`.
 *
 * Delivery is at least once and a function may die between any two lines, or see an error from a call
 * that succeeded; a failed invocation is redelivered with backoff for up to 24 hours
 * (https://cloud.google.com/functions/docs/bestpractices/retries). So the claim is a lease (src/cloud/claim.ts), and executions carry labels (the step and
 * its source root) that are looked up before starting one, before releasing a claim after an error, and
 * before taking over an expired claim. Malformed events are acknowledged; transient failures throw so the
 * platform redelivers.
 */
export async function handleFinalized(event: { id?: string; data?: unknown }, deps: TriggerDeps): Promise<TriggerOutcome> {
  const now = deps.now ?? Date.now;
  const sleep = deps.sleep ?? ((ms: number) => new Promise<void>((r) => setTimeout(r, ms)));
  const data = event.data as { bucket?: unknown; name?: unknown } | undefined;
  if (typeof data?.bucket !== "string" || typeof data?.name !== "string") {
    deps.log.warn("malformed storage event ignored", { eventId: event.id ?? null });
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

  const claim = new StepClaim(await deps.openStore(decision.destination), stepDirName(decision.step), config.claimLeaseMs, now);
  const labels = executionLabels(decision.source, decision.step);
  /** The newest execution for this step created since `claimedAt` (older ones belong to earlier claims). */
  const findExecution = async (claimedAt: string): Promise<ExecutionRef | undefined> => {
    const since = Date.parse(claimedAt) - CLOCK_SKEW_MS;
    const found = await deps.executions.find(config.workflow, labels);
    return found.find((e) => !(Date.parse(e.startTime) < since));
  };
  const fresh = (): ClaimRecord => ({
    source: decision.source,
    step: decision.step,
    eventId: event.id ?? null,
    claimedAt: new Date(now()).toISOString(),
    execution: null,
  });

  // 1. Hold the claim: create it, or take over one whose holder is certainly dead.
  let record = fresh();
  let version: string | undefined;
  const waitUntil = now() + (deps.waitForPeerMs ?? 20_000);
  while (version === undefined) {
    const state = await claim.read();
    if (state.kind === "absent") {
      record = fresh();
      version = await claim.create(record);
      continue; // undefined: another delivery created it first; look again
    }
    if (state.kind === "started") {
      log.info("step already claimed by an execution; duplicate event acknowledged", {
        claim: claim.url,
        execution: state.record.execution,
      });
      return "duplicate";
    }
    if (!state.expired) {
      // Another delivery holds the claim and is starting the execution right now (or died a moment ago).
      if (now() >= waitUntil) {
        throw new ClaimBusyError(
          `${claim.url}: claimed at ${state.record.claimedAt} by another delivery that has not started an execution yet; retry later`,
        );
      }
      await sleep(250);
      continue;
    }
    // Expired without an execution: its delivery died, perhaps after starting one.
    const orphan = await findExecution(state.record.claimedAt);
    if (orphan) {
      const recorded = await claim.replace(state.version, { ...state.record, execution: orphan.name });
      log.warn("an expired claim's execution exists; recorded it", {
        claim: claim.url,
        execution: orphan.name,
        recorded: recorded !== undefined,
      });
      return recorded === undefined ? "duplicate" : "adopted";
    }
    record = fresh();
    version = await claim.replace(state.version, record);
    if (version !== undefined)
      log.warn("took over an expired claim that never started an execution", { claim: claim.url, expiredClaim: state.record });
  }

  // 2. Start the execution, unless one started since this claim's time (by a delivery that saw an error).
  let existing: ExecutionRef | undefined;
  try {
    existing = await findExecution(record.claimedAt);
  } catch (e) {
    // Nothing was started by this delivery: give the claim back so the redelivery need not wait for the lease.
    await claim.release(version);
    throw e;
  }
  if (existing) {
    await claim.replace(version, { ...record, execution: existing.name });
    log.warn("an execution for this step already exists; recorded it", { execution: existing.name });
    return "adopted";
  }
  const argument: WorkflowArgument = {
    source: decision.source,
    destination: decision.destination,
    step: decision.step,
    groups: config.groups,
  };
  let execution: string;
  try {
    execution = await deps.executions.start(config.workflow, argument, labels);
  } catch (e) {
    // The call may have failed after the execution was created (a timeout, a dropped connection).
    let found: ExecutionRef | undefined;
    try {
      found = await findExecution(record.claimedAt);
    } catch (lookup) {
      if (neverSent(e)) {
        await claim.release(version);
        throw e;
      }
      // Cannot tell whether the execution was created: keep the claim. Its lease runs out and a redelivery
      // looks again then.
      log.warn("starting failed and the execution lookup failed too; the claim is kept until its lease ends", {
        error: (e as Error).message,
        lookupError: (lookup as Error).message,
      });
      throw e;
    }
    if (!found) {
      await claim.release(version);
      if (isPermanentApiError(e)) {
        // Redelivery cannot fix a refused request: acknowledge, loudly. `orbax2reg cloud start` can retry later.
        log.error(`the workflow refused to start: ${(e as Error).message}`, { workflow: config.workflow, argument });
        return "refused";
      }
      throw e;
    }
    log.warn("starting reported an error, but the execution exists; keeping it", { error: (e as Error).message, execution: found.name });
    execution = found.name;
  }
  if ((await claim.replace(version, { ...record, execution })) === undefined) {
    log.warn("the claim changed while starting; the execution runs all the same", { claim: claim.url, execution });
  }
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
      // The conversion runs either way; a redelivery would only see the claim and stop.
      log.error("could not publish conversion.requested", { execution, error: (e as Error).message });
    }
  }
  return "started";
}

/** The request never reached the server (refused connection, unknown host): nothing can have been created. */
function neverSent(e: unknown): boolean {
  for (let cur = e as { code?: unknown; cause?: unknown } | undefined; cur; cur = cur.cause as typeof cur) {
    if (cur.code === "ECONNREFUSED" || cur.code === "ENOTFOUND" || cur.code === "EAI_AGAIN") return true;
  }
  return false;
}
