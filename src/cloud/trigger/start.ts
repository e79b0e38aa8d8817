import type { ClaimRecord } from "../../convert/work-dir.js";
import { ClaimBusyError, ConflictError, DeadlineError } from "../../errors.js";
import { stepDirName } from "../../orbax/step-name.js";
import type { Store } from "../../store/store.js";
import { type ExecutionSummary, type Executions, executionLabels, isLive, type WorkflowArgument } from "../api/executions.js";
import { isNotFound, isPermanent } from "../api/grpc.js";
import type { Logger } from "../api/log.js";
import { type ClaimState, StepClaim } from "./claim.js";

/**
 * Starting exactly one Workflows execution for a step, whoever asks: the trigger function (for every
 * delivery of a commit event) and `orbax2reg cloud start` / `backfill` (by hand). Both go through the
 * step's claim (src/cloud/trigger/claim.ts) and look executions up by their labels, so no caller ever starts a
 * second execution for a step that has one.
 */
export interface StartRequest {
  /** What the workflow receives (workflows/convert.yaml's argument). */
  readonly argument: WorkflowArgument;
  /** The CloudEvent id that asked, or null when a person or script did. */
  readonly eventId: string | null;
  /**
   * Whether an execution for the step that has already finished, created since the claim (by a concurrent
   * caller that then lost its answer), counts as this request's. The trigger: yes (a redelivery must not
   * convert a step twice). By hand: no, the person asks for a new run.
   */
  readonly adoptFinished: boolean;
}

export interface StartDeps {
  /** projects/P/locations/L/workflows/W */
  readonly workflow: string;
  readonly claimLeaseMs: number;
  openStore(location: string): Promise<Store>;
  readonly executions: Executions;
  readonly log: Logger;
  readonly now?: () => number;
  readonly sleep?: (ms: number) => Promise<void>;
  /**
   * How long to wait for a concurrent caller that holds a fresh claim to record its execution, before
   * ClaimBusyError. Well inside the function's timeout.
   */
  readonly waitForPeerMs?: number;
  /**
   * When (by `now`) this caller stops: no execution is started after it. The trigger sets it well before the
   * function's timeout. Whatever it is, no execution is started later than half the claim's lease after its
   * claim was written.
   */
  readonly deadline?: number;
}

/**
 * duplicate: the step's claim names an execution already; adopted: an execution for the step existed (started
 * by a caller that died or saw an error) and is now recorded; started: this call started it; refused: the
 * Workflows API refused the request itself (a retry cannot help).
 */
export type StartOutcome =
  | { readonly kind: "duplicate" | "adopted" | "started"; readonly execution: string }
  | { readonly kind: "refused"; readonly message: string };

/** Executions created this long before a claim's time still count as that claim's (clock skew between instances). */
const CLOCK_SKEW_MS = 60_000;

/** The claim of the step `argument` converts, in its destination. */
export async function claimFor(
  argument: WorkflowArgument,
  deps: Pick<StartDeps, "openStore" | "claimLeaseMs" | "now">,
): Promise<StepClaim> {
  return new StepClaim(await deps.openStore(argument.destination), stepDirName(argument.step), deps.claimLeaseMs, deps.now);
}

/**
 * Makes sure exactly one execution converts the step, starting it if none does. Any caller may die between
 * any two lines, or see an error from a call that succeeded: the claim is a lease, and executions carry
 * labels (the step and its source root) that are looked up before starting one, before releasing a claim
 * after an error, and before taking over an expired claim.
 */
export async function startOnce(request: StartRequest, deps: StartDeps): Promise<StartOutcome> {
  const now = deps.now ?? Date.now;
  const sleep = deps.sleep ?? ((ms: number) => new Promise<void>((r) => setTimeout(r, ms)));
  const { argument } = request;
  const log = deps.log;
  const claim = await claimFor(argument, deps);
  const labels = executionLabels(argument.source, argument.step);
  /** The newest execution for this step created since `claimedAt` (older ones belong to earlier claims). */
  const findExecution = async (claimedAt: string): Promise<ExecutionSummary | undefined> => {
    // An unreadable claim time counts as the epoch: every execution of the step is then a candidate.
    const since = new Date(Math.max(0, (Date.parse(claimedAt) || 0) - CLOCK_SKEW_MS)).toISOString();
    // By createTime (the API's filter), not startTime: a backlogged (QUEUED) execution has none yet.
    const found = await deps.executions.find(deps.workflow, labels, { createdSince: since });
    return found.find((e) => request.adoptFinished || isLive(e));
  };
  const fresh = (): ClaimRecord => ({
    source: argument.source,
    step: argument.step,
    eventId: request.eventId,
    claimedAt: new Date(now()).toISOString(),
    execution: null,
  });

  // 1. Hold the claim: create it, or take over one whose lease is over (its holder starts nothing after that).
  let record = fresh();
  let version: string | undefined;
  const waitUntil = Math.min(now() + (deps.waitForPeerMs ?? 20_000), deps.deadline ?? Number.POSITIVE_INFINITY);
  while (version === undefined) {
    const state = await claim.read();
    if (state.kind === "absent") {
      record = fresh();
      version = await claim.create(record);
      continue; // undefined: another caller created it first; look again
    }
    if (state.kind === "started") {
      log.info("step already claimed by an execution; duplicate event acknowledged", {
        claim: claim.url,
        execution: state.record.execution,
      });
      return { kind: "duplicate", execution: state.record.execution as string };
    }
    if (!state.expired) {
      // Another caller holds the claim and is starting the execution right now (or died a moment ago).
      if (now() >= waitUntil) {
        throw new ClaimBusyError(
          `${claim.url}: claimed at ${state.record.claimedAt} by another delivery that has not started an execution yet; retry later`,
        );
      }
      await sleep(250);
      continue;
    }
    // Expired without an execution: its caller died, perhaps after starting one.
    const orphan = await findExecution(state.record.claimedAt);
    if (orphan) {
      const recorded = await claim.replace(state.version, { ...state.record, execution: orphan.name });
      log.warn("an expired claim's execution exists; recorded it", {
        claim: claim.url,
        execution: orphan.name,
        recorded: recorded !== undefined,
      });
      return { kind: recorded === undefined ? "duplicate" : "adopted", execution: orphan.name };
    }
    record = fresh();
    version = await claim.replace(state.version, record);
    if (version !== undefined)
      log.warn("took over an expired claim that never started an execution", { claim: claim.url, expiredClaim: state.record });
  }

  // 2. Start the execution, unless one started since this claim's time (by a caller that saw an error).
  // Never after this caller's deadline: a delivery past it may be a throttled instance that resumed after a
  // redelivery took its lease over (src/cloud/trigger/claim.ts).
  const deadline = Math.min(deps.deadline ?? Number.POSITIVE_INFINITY, Date.parse(record.claimedAt) + deps.claimLeaseMs / 2);
  const giveUp = async (): Promise<never> => {
    const released = await claim.release(version as string).catch(() => false);
    throw new DeadlineError(
      `${claim.url}: this caller's deadline (${new Date(deadline).toISOString()}) passed before it started an execution; ` +
        `${released ? "claim released" : "the claim had moved on"}, nothing started; retry later`,
    );
  };
  if (now() >= deadline) return giveUp();
  let existing: ExecutionSummary | undefined;
  try {
    existing = await findExecution(record.claimedAt);
  } catch (e) {
    // Nothing was started by this caller: give the claim back so a retry need not wait for the lease.
    await claim.release(version);
    throw e;
  }
  if (existing) {
    if ((await claim.replace(version, { ...record, execution: existing.name })) === undefined)
      return lostBeforeStart(await claim.read(), claim.url, log);
    log.warn("an execution for this step already exists; recorded it", { execution: existing.name });
    return { kind: "adopted", execution: existing.name };
  }
  // Right before the call: the claim is still the one this caller wrote (its generation), and the deadline
  // has not passed (a process stopped for long resumes here with its clock moved on).
  const current = await claim.read();
  if (current.kind !== "pending" || current.version !== version) return lostBeforeStart(current, claim.url, log);
  if (now() >= deadline) return giveUp();
  let execution: string;
  try {
    execution = await deps.executions.start(deps.workflow, argument, labels);
  } catch (e) {
    // The call may have failed after the execution was created (a timeout, a dropped connection).
    let found: ExecutionSummary | undefined;
    try {
      found = await findExecution(record.claimedAt);
    } catch (lookup) {
      if (neverSent(e)) {
        await claim.release(version);
        throw e;
      }
      // Cannot tell whether the execution was created: keep the claim. Its lease runs out and a retry
      // looks again then.
      log.warn("starting failed and the execution lookup failed too; the claim is kept until its lease ends", {
        error: (e as Error).message,
        lookupError: (lookup as Error).message,
      });
      throw e;
    }
    if (!found) {
      await claim.release(version);
      if (isPermanent(e)) return { kind: "refused", message: (e as Error).message };
      throw e;
    }
    log.warn("starting reported an error, but the execution exists; keeping it", { error: (e as Error).message, execution: found.name });
    execution = found.name;
  }
  if ((await claim.replace(version, { ...record, execution })) !== undefined) return { kind: "started", execution };
  return settleAfterLoss(claim, { ...record, execution }, deps, log);
}

/**
 * The claim moved on between the last check and the call (the caller was stopped or throttled in between):
 * nothing was started. Another caller has started the step, or is starting it.
 */
function lostBeforeStart(current: ClaimState, url: string, log: Logger): StartOutcome {
  if (current.kind === "started") {
    log.warn("the claim was taken over before this caller started an execution; nothing started", {
      claim: url,
      execution: current.record.execution,
    });
    return { kind: "duplicate", execution: current.record.execution as string };
  }
  throw new ClaimBusyError(`${url}: the claim was taken over before this caller started an execution; nothing started; retry later`);
}

/**
 * This caller created `mine.execution`, but its claim had moved on meanwhile: taken over by a caller that
 * thought it dead. Exactly one execution must stay. The claim decides, by conditional writes: if it names
 * another execution, this one is cancelled; if another caller holds it without an execution yet, this one is
 * recorded in its place (that caller sees it before its own start, or cancels its own after, by this same rule).
 */
async function settleAfterLoss(claim: StepClaim, mine: ClaimRecord, deps: StartDeps, log: Logger): Promise<StartOutcome> {
  const execution = mine.execution as string;
  for (let attempt = 1; attempt <= 5; attempt++) {
    const state = await claim.read();
    if (state.kind === "started" && state.record.execution === execution) return { kind: "started", execution };
    if (state.kind === "started") {
      const other = state.record.execution as string;
      log.warn("the claim was taken over while this caller started an execution, which another one converts: cancelling it", {
        claim: claim.url,
        cancelled: execution,
        execution: other,
      });
      await deps.executions
        .cancel(execution)
        .catch((e) => log.error("could not cancel the second execution of the step", { execution, error: (e as Error).message }));
      return { kind: "duplicate", execution: other };
    }
    const recorded = state.kind === "absent" ? await claim.create(mine) : await claim.replace(state.version, mine);
    if (recorded !== undefined) {
      log.warn("the claim was taken over while this caller started an execution; recorded this one in it", {
        claim: claim.url,
        execution,
      });
      return { kind: "started", execution };
    }
  }
  log.error("the claim keeps changing; the execution runs all the same", { claim: claim.url, execution });
  return { kind: "started", execution };
}

/** The request never reached the server (refused connection, unknown host): nothing can have been created. */
function neverSent(e: unknown): boolean {
  for (let cur = e as { code?: unknown; cause?: unknown } | undefined; cur; cur = cur.cause as typeof cur) {
    if (cur.code === "ECONNREFUSED" || cur.code === "ENOTFOUND" || cur.code === "EAI_AGAIN") return true;
  }
  return false;
}

/** What `orbax2reg cloud start` asks for. */
export interface ManualStart {
  readonly argument: WorkflowArgument;
}

/**
 * Starts a conversion by hand, with the same claim the trigger uses: refused (ConflictError) while an
 * execution for the step is running or another caller is starting one. A claim whose execution has finished
 * (converted, failed or cancelled) is given up first, so that the step can be converted again.
 */
export async function startByHand(request: ManualStart, deps: StartDeps): Promise<Exclude<StartOutcome, { kind: "duplicate" }>> {
  const claim = await claimFor(request.argument, deps);
  const state = await claim.read();
  if (state.kind === "started") {
    const execution = await deps.executions.get(state.record.execution as string).catch((e) => {
      if (isNotFound(e)) return undefined; // deleted: nothing runs
      throw e;
    });
    if (execution && isLive(execution)) {
      throw new ConflictError(
        `step ${request.argument.step} is being converted by ${execution.name} (${execution.startTime ? `started ${execution.startTime}` : execution.state}); \`orbax2reg cloud cancel\` stops it`,
        { path: claim.url },
      );
    }
    await claim.release(state.version);
  }
  let outcome: StartOutcome;
  try {
    outcome = await startOnce({ argument: request.argument, eventId: null, adoptFinished: false }, deps);
  } catch (e) {
    if (e instanceof ClaimBusyError) throw new ConflictError(`${e.message.replace(/^[^:]*: /, "")}`, { path: claim.url });
    throw e;
  }
  if (outcome.kind === "duplicate") {
    throw new ConflictError(`step ${request.argument.step} was just started by ${outcome.execution}`, { path: claim.url });
  }
  return outcome;
}
