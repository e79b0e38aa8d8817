import { ConfigError } from "../../errors.js";

/**
 * Reading deployment settings from environment variables: the one reader for the trigger function (set by
 * terraform), the Cloud Run jobs (set by the workflow and by Cloud Run itself) and the CLI (a user may run
 * it as a Cloud Run job). A bad value is a ConfigError (src/errors.ts) naming the variable and what it holds:
 * redelivering an event or retrying a job cannot fix it, only a redeploy can.
 */

export type Env = Readonly<Record<string, string | undefined>>;

/** A variable that must be present and non-empty. */
export function requiredString(env: Env, name: string, pattern?: { re: RegExp; what: string }): string {
  const v = env[name];
  if (v === undefined || v === "") throw new ConfigError(name, v, "required");
  if (pattern && !pattern.re.test(v)) throw new ConfigError(name, v, `must be ${pattern.what}`);
  return v;
}

/** A variable that may be absent or empty (then `fallback`). */
export function optionalString(env: Env, name: string, fallback: string): string {
  const v = env[name];
  return v === undefined || v === "" ? fallback : v;
}

/** An integer in [min, max]; absent or empty gives `fallback` (when there is one). */
export function integer(env: Env, name: string, o: { min: number; max: number; fallback?: number }): number {
  const v = env[name];
  if (v === undefined || v === "") {
    if (o.fallback !== undefined) return o.fallback;
    throw new ConfigError(name, v, "required");
  }
  if (!/^\d+$/.test(v) || Number(v) < o.min || Number(v) > o.max) {
    throw new ConfigError(name, v, `must be an integer from ${o.min} to ${o.max}`);
  }
  return Number(v);
}

/** An integer in [min, max], or undefined when absent or empty (a setting that is optional with no default). */
export function optionalInteger(env: Env, name: string, o: { min: number; max: number }): number | undefined {
  const v = env[name];
  return v === undefined || v === "" ? undefined : integer(env, name, o);
}

/**
 * A switch: 1, true or yes (any case) is on; absent, empty, 0, false or no is off (the workflow passes
 * "true" / "false"). Anything else is refused: a misspelt switch must not silently mean off.
 */
export function flag(env: Env, name: string): boolean {
  const v = env[name];
  if (v === undefined || /^(|0|false|no)$/i.test(v)) return false;
  if (/^(1|true|yes)$/i.test(v)) return true;
  throw new ConfigError(name, v, "must be 1, true or yes (on), or 0, false, no or empty (off)");
}

/** ORBAX2REG_EVENTS_TOPIC: a full topic id, or undefined (absent or empty: no events). */
export function eventsTopic(env: Env): string | undefined {
  const topic = optionalString(env, "ORBAX2REG_EVENTS_TOPIC", "");
  if (topic === "") return undefined;
  return requiredString(env, "ORBAX2REG_EVENTS_TOPIC", {
    re: /^projects\/[^/]+\/topics\/[^/]+$/,
    what: "a full topic id, projects/PROJECT/topics/NAME",
  });
}

/** Which task of a Cloud Run job execution this process is. */
export interface CloudRunTask {
  /** CLOUD_RUN_TASK_INDEX: 0 .. count - 1. */
  readonly index: number;
  /** CLOUD_RUN_TASK_COUNT: the execution's number of tasks. */
  readonly count: number;
  /** CLOUD_RUN_TASK_ATTEMPT: how many times this task has been retried (0 on its first try). */
  readonly attempt: number;
}

/** What a process that is not a Cloud Run job task is: the only task, on its first try. */
export const OUTSIDE_CLOUD_RUN: CloudRunTask = { index: 0, count: 1, attempt: 0 };

/** A bound that only rejects nonsense, and numbers too big for Number() to hold exactly. */
const TASK_MAX = 1_000_000;

/**
 * Cloud Run sets CLOUD_RUN_TASK_INDEX, CLOUD_RUN_TASK_COUNT and CLOUD_RUN_TASK_ATTEMPT in every job task
 * (https://cloud.google.com/run/docs/container-contract#jobs-env-vars); each one absent or empty reads as
 * outside Cloud Run (OUTSIDE_CLOUD_RUN). A malformed value is a ConfigError, unless `lenient`: then it too
 * reads as its default, for the records a task writes on its way out (progress, failure reports), which
 * must never fail themselves.
 */
export function cloudRunTask(env: Env, o: { lenient?: boolean } = {}): CloudRunTask {
  const read = (name: string, min: number, fallback: number): number => {
    try {
      return integer(env, name, { min, max: TASK_MAX, fallback });
    } catch (e) {
      if (o.lenient && e instanceof ConfigError) return fallback;
      throw e;
    }
  };
  return {
    index: read("CLOUD_RUN_TASK_INDEX", 0, OUTSIDE_CLOUD_RUN.index),
    count: read("CLOUD_RUN_TASK_COUNT", 1, OUTSIDE_CLOUD_RUN.count),
    attempt: read("CLOUD_RUN_TASK_ATTEMPT", 0, OUTSIDE_CLOUD_RUN.attempt),
  };
}
