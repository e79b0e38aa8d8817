/**
 * Reading deployment settings from environment variables (set by terraform for the function and the
 * workflow, by the workflow for the jobs). A bad value is a ConfigError naming the variable and what it
 * holds: redelivering an event or retrying a job cannot fix it, only a redeploy can.
 */
export class ConfigError extends Error {
  override readonly name = "ConfigError";
  constructor(
    readonly variable: string,
    readonly value: string | undefined,
    readonly why: string,
  ) {
    super(`environment variable ${variable}${value === undefined ? " is not set" : `=${JSON.stringify(value)}`}: ${why}`);
  }
}

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

/** ORBAX2REG_EVENTS_TOPIC: a full topic id, or undefined (absent or empty: no events). */
export function eventsTopic(env: Env): string | undefined {
  const topic = optionalString(env, "ORBAX2REG_EVENTS_TOPIC", "");
  if (topic === "") return undefined;
  return requiredString(env, "ORBAX2REG_EVENTS_TOPIC", {
    re: /^projects\/[^/]+\/topics\/[^/]+$/,
    what: "a full topic id, projects/PROJECT/topics/NAME",
  });
}
