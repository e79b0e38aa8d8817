import { planIdentityOnRecord } from "../../convert/ownership.js";
import { PLAN_KEY } from "../../convert/work-dir.js";
import { EXIT_FAILURE, Orbax2RegError } from "../../errors.js";
import { stepDirName } from "../../orbax/step.js";
import { deleteSeen, describe, joinKey, type ObjectInfo, type Store } from "../../store/store.js";
import { mapLimited } from "../../util/budget.js";
import { type Env, eventsTopic, integer } from "../api/env.js";
import { type ConversionEvent, pubsubPublisher } from "../api/events.js";
import type { Logger } from "../api/log.js";

/**
 * Retention of converted steps: after the finalize job commits a step, older converted steps beyond the
 * policy are deleted. The policy is AXLearn's own checkpoint garbage collection, so `keep_last_n` and
 * `keep_every_n_steps` mean here what they mean in a training config (see stepsToPrune).
 */

export interface RetentionPolicy {
  /** AXLearn `keep_last_n`: the newest N committed steps are kept. null or 0: the rule is off. */
  readonly keepLastN: number | null;
  /** AXLearn `keep_every_n_steps`: of the older steps, one at least every N steps is kept. null or 0: off. */
  readonly keepEveryNSteps: number | null;
}

/** Keep everything: what the pipeline does unless a retention variable is set. */
export const KEEP_ALL: RetentionPolicy = { keepLastN: null, keepEveryNSteps: null };

export const isKeepAll = (p: RetentionPolicy) => !p.keepLastN && !p.keepEveryNSteps;

/**
 * The committed steps to delete, oldest first: AXLearn's `Checkpointer._run_garbage_collection`
 * (apple/axlearn, axlearn/common/checkpointer.py) applied to `steps`, the committed converted steps.
 *   1. Steps are taken newest first; the first `keep_last_n` are kept.
 *   2. The rest are walked oldest first; a step is kept when it is at least `keep_every_n_steps` *steps*
 *      (step numbers, not positions) after the last step this walk kept, the first one always. So with
 *      keep_every_n_steps=3, steps 1..5 keep 1 and 4; steps 100..500 keep them all. The steps kept by
 *      keep_last_n do not reset that walk (AXLearn starts it from -inf over the older steps only).
 *   3. Everything else is deleted.
 * Where this differs from AXLearn, on purpose:
 *   - AXLearn's keep_last_n defaults to 1 and keep_every_n_steps to None, which deletes all but the newest
 *     step. Here both rules off (null or 0) keep everything, the safe default for a tool that deletes
 *     checkpoints it did not train; with only keep_every_n_steps set, keep_last_n is 0, as in AXLearn.
 *   - AXLearn also deletes uncommitted directories older than the newest committed one. Uncommitted steps
 *     are never passed here: a step without an index may be a conversion still running.
 *   - `protect` (the step just written) is never returned, even when the policy would drop it (a step
 *     older than the ones kept, converted late): the conversion that just committed it asked for it.
 */
export function stepsToPrune(steps: readonly number[], policy: RetentionPolicy, protect: number): number[] {
  for (const [name, v] of [
    ["keepLastN", policy.keepLastN],
    ["keepEveryNSteps", policy.keepEveryNSteps],
  ] as const) {
    if (v !== null && !(Number.isSafeInteger(v) && v >= 0))
      throw new RangeError(`${name} must be null or a non-negative integer, got ${v}`);
  }
  if (isKeepAll(policy)) return [];
  const keepLastN = policy.keepLastN ?? 0;
  const keepEvery = policy.keepEveryNSteps ?? 0;
  const newestFirst = [...new Set(steps)].sort((a, b) => b - a);
  const older = newestFirst.slice(keepLastN);
  const prune: number[] = [];
  let lastKept = Number.NEGATIVE_INFINITY;
  for (const step of older.reverse()) {
    if (keepEvery > 0 && step - lastKept >= keepEvery) lastKept = step;
    else prune.push(step);
  }
  return prune.filter((s) => s !== protect);
}

/** One pruned step, as logged and announced. */
export interface PrunedStep {
  readonly step: number;
  readonly stepDir: string;
  /** Objects deleted, the index included. */
  readonly objects: number;
  readonly bytes: number;
  /** The Orbax step it was converted from, as its plan records it ("" when unreadable). */
  readonly source: string;
}

/** Some steps chosen for pruning could not be deleted (the others were); the next conversion tries again. */
export class RetentionError extends Orbax2RegError {
  readonly kind = "RETENTION";
  readonly exitCode = EXIT_FAILURE;
  readonly retryable = true;
  constructor(
    readonly failures: readonly { readonly step: number; readonly error: string }[],
    readonly pruned: readonly PrunedStep[],
  ) {
    super(`could not prune ${failures.map((f) => `step ${f.step} (${f.error})`).join("; ")}`);
  }
}

export type Publish = (event: ConversionEvent) => Promise<void>;

export interface PruneOptions {
  /** Announces each pruned step (conversion.pruned); none: nothing is published. */
  readonly publish?: Publish;
  /** The Workflows execution that pruned, for the events. */
  readonly execution?: string | null;
  /** Deletions in flight at once. */
  readonly concurrency?: number;
}

const STEP_DIR = /^step_\d{8}$/;
const INDEX = "index";

/**
 * Applies `policy` to the converted steps directly under the destination root after `justWritten` was
 * committed. A candidate is a `step_XXXXXXXX` directory with both an index (committed) and this tool's
 * plan (`.orbax2reg/plan.json`: this tool wrote it); anything else (a conversion still running, which has
 * no index yet; a step another program wrote) is neither counted nor touched, and neither is
 * `justWritten`. Every key deleted comes from listing under the root, so nothing outside it is touched.
 *
 * Per step: the index goes first, so an interrupted deletion leaves an uncommitted step that AXLearn
 * readers skip, never a committed step with missing arrays; then every other object of the step (the
 * trigger's claim included: deleting the step is deleting its conversion). A step taken over meanwhile
 * (`--force` wrote another plan) is left to its new owner once its index is gone.
 *
 * Returns the pruned steps; throws a RetentionError naming the steps that failed (after trying them all).
 */
export async function pruneConverted(
  destination: Store,
  justWritten: number,
  policy: RetentionPolicy,
  log: Logger,
  publishOrOptions?: Publish | PruneOptions,
): Promise<PrunedStep[]> {
  const o: PruneOptions = typeof publishOrOptions === "function" ? { publish: publishOrOptions } : (publishOrOptions ?? {});
  if (isKeepAll(policy)) return [];
  const concurrency = o.concurrency ?? 32;
  const { dirs } = await destination.listDir("");
  const committed: number[] = [];
  await mapLimited(
    dirs.filter((d) => STEP_DIR.test(d)),
    concurrency,
    async (dir) => {
      const [index, plan] = await Promise.all([destination.stat(joinKey(dir, INDEX)), destination.stat(joinKey(dir, PLAN_KEY))]);
      if (index !== undefined && plan !== undefined) committed.push(Number(dir.slice("step_".length)));
    },
  );
  const doomed = stepsToPrune(committed, policy, justWritten);
  const pruned: PrunedStep[] = [];
  const failures: { step: number; error: string }[] = [];
  for (const step of doomed) {
    const stepDir = stepDirName(step);
    let done: PrunedStep | undefined;
    try {
      done = await pruneStep(destination, stepDir, step, concurrency);
    } catch (e) {
      const error = (e as Error).message;
      failures.push({ step, error });
      log.error("could not prune a converted step", {
        step,
        stepDir,
        error,
        keepLastN: policy.keepLastN,
        keepEveryNSteps: policy.keepEveryNSteps,
      });
      continue;
    }
    if (done === undefined) {
      log.warn("a converted step chosen for pruning was taken over by another conversion; left to it", { step, stepDir });
      continue;
    }
    pruned.push(done);
    log.info("pruned a converted step", {
      step,
      stepDir,
      location: describe(destination, stepDir),
      objects: done.objects,
      bytes: done.bytes,
      justWritten,
      keepLastN: policy.keepLastN,
      keepEveryNSteps: policy.keepEveryNSteps,
    });
    if (o.publish) {
      try {
        await o.publish(prunedEvent(destination.url, done, o.execution ?? null));
      } catch (e) {
        // The step is gone either way; the log line above records it.
        log.error("pruned a converted step but could not publish conversion.pruned", { step, error: (e as Error).message });
      }
    }
  }
  if (failures.length > 0) throw new RetentionError(failures, pruned);
  return pruned;
}

/** The conversion.pruned event for a step deleted from the destination root `destination`. */
export function prunedEvent(destination: string, p: PrunedStep, execution: string | null): ConversionEvent {
  return {
    type: "conversion.pruned",
    source: p.source,
    destination,
    step: p.step,
    execution,
    arrays: null,
    bytes: p.bytes,
    duration: null,
    error: null,
    time: new Date().toISOString(),
  };
}

/**
 * Deletes one committed step, index first; undefined when another conversion's plan appeared meanwhile. Every
 * delete names the version it listed (`deleteSeen`: on GCS `ifGenerationMatch`), so a delete retried after a lost
 * answer, or one that races a new conversion rewriting the step, never removes an object written after the listing.
 */
async function pruneStep(destination: Store, stepDir: string, step: number, concurrency: number): Promise<PrunedStep | undefined> {
  const before = await planHead(destination, stepDir);
  const indexKey = joinKey(stepDir, INDEX);
  const index = await destination.stat(indexKey);
  if (index !== undefined) await deleteSeen(destination, index);
  const after = await planHead(destination, stepDir);
  if (after.id !== before.id) return undefined;
  const listed: ObjectInfo[] = [];
  let bytes = index?.size ?? 0;
  for await (const obj of destination.list(`${stepDir}/`)) {
    listed.push(obj);
    bytes += obj.size;
  }
  // The plan last: while any object remains, the step still says whose it is.
  const planKey = joinKey(stepDir, PLAN_KEY);
  await mapLimited(
    listed.filter((o) => o.key !== planKey),
    concurrency,
    (o) => deleteSeen(destination, o),
  );
  const plan = listed.find((o) => o.key === planKey);
  if (plan !== undefined) await deleteSeen(destination, plan);
  await destination.removeAbandoned?.(`${stepDir}/`);
  await destination.removeEmptyDirectories?.(`${stepDir}/`);
  return { step, stepDir, objects: listed.length + (index ? 1 : 0), bytes, source: before.source };
}

/** The id and source of the plan on record (ownership.ts reads the head, bounded). */
async function planHead(destination: Store, stepDir: string): Promise<{ id: string | undefined; source: string }> {
  const plan = await planIdentityOnRecord(destination, stepDir);
  const src = plan?.source;
  const source = src === undefined ? "" : src.stepDir ? `${src.root.replace(/\/+$/, "")}/${src.stepDir}` : src.root;
  return { id: plan?.id, source };
}

/** Retention settings of the finalize job (terraform: keep_last_n, keep_every_n_steps, the events topic). */
export interface RetentionConfig {
  readonly policy: RetentionPolicy;
  /** Full topic id for conversion.pruned; undefined: not published. */
  readonly eventsTopic: string | undefined;
  /** The Workflows execution running the job (ORBAX2REG_EXECUTION), for the events. */
  readonly execution: string | null;
}

/**
 * Parses ORBAX2REG_KEEP_LAST_N, ORBAX2REG_KEEP_EVERY_N_STEPS (unset, empty or 0: that rule off) and
 * ORBAX2REG_EVENTS_TOPIC. A bad value is a ConfigError: the job's permanent failure (exit 2), like its other
 * configuration errors; only a redeploy can fix it.
 */
export function retentionFromEnv(env: Env): RetentionConfig {
  const rule = (name: string) => {
    const v = integer(env, name, { min: 0, max: 99_999_999, fallback: 0 });
    return v === 0 ? null : v;
  };
  return {
    policy: { keepLastN: rule("ORBAX2REG_KEEP_LAST_N"), keepEveryNSteps: rule("ORBAX2REG_KEEP_EVERY_N_STEPS") },
    eventsTopic: eventsTopic(env),
    execution: env.ORBAX2REG_EXECUTION || null,
  };
}

/**
 * The finalize job's last act, once the index is written: prune by the configured policy (nothing when no
 * rule is set). A failure to prune is logged at ERROR and swallowed: the new step is committed, so the job
 * exits 0 and the workflow reports the conversion succeeded; the steps left over are still beyond the
 * policy, so the next conversion's finalize deletes them.
 */
export async function pruneAfterFinalize(
  config: RetentionConfig,
  destinationUrl: string,
  justWritten: number,
  log: Logger,
  deps: { openStore?: (url: string) => Promise<Store>; publish?: (topic: string, event: ConversionEvent) => Promise<void> } = {},
): Promise<PrunedStep[]> {
  if (isKeepAll(config.policy)) return [];
  const rlog = log.with({ phase: "finalize", retention: { ...config.policy } });
  try {
    const open = deps.openStore ?? (await import("../../store/open.js")).openStore;
    const destination = await open(destinationUrl);
    const topic = config.eventsTopic;
    const send = topic === undefined ? undefined : (deps.publish ?? (await pubsubPublisher()));
    const pruned = await pruneConverted(destination, justWritten, config.policy, rlog, {
      ...(topic !== undefined && send ? { publish: (event: ConversionEvent) => send(topic, event) } : {}),
      execution: config.execution,
    });
    rlog.info("retention applied", { step: justWritten, pruned: pruned.map((p) => p.step) });
    return pruned;
  } catch (e) {
    rlog.error(`pruning failed; step ${justWritten} is committed and the next conversion retries: ${(e as Error).message}`, {
      step: justWritten,
      errorType: (e as Error).name,
    });
    return e instanceof RetentionError ? [...e.pruned] : [];
  }
}
