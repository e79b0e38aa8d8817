import {
  DEFAULT_CONVERT_EVERY_N_STEPS,
  DEFAULT_DESTINATION_TEMPLATE,
  DEFAULT_GROUPS,
  FULL_WORKFLOW_ID,
  LONGEST_CLAIM_LEASE_SECONDS,
  MAX_GROUPS,
} from "../../defaults.js";
import { ConfigError } from "../../errors.js";
import { type Env, eventsTopic, integer, optionalString, requiredString } from "../api/env.js";
import type { TriggerConfig } from "./classify.js";

/** Everything the trigger function is configured with (terraform/modules/orbax2reg/function.tf). */
export interface TriggerHandlerConfig extends TriggerConfig {
  /** Full workflow id: projects/P/locations/L/workflows/W. */
  readonly workflow: string;
  readonly groups: number;
  /** Full topic id for conversion events; undefined means no events. */
  readonly eventsTopic: string | undefined;
  /**
   * How long a claim that never recorded an execution protects its step. Longer than the function's
   * timeout (and so than every delivery's deadline): past it, another delivery may take over.
   */
  readonly claimLeaseMs: number;
  /**
   * How long one delivery may work before it stops (starting nothing after it): well before the function's
   * timeout, past which an instance "might be throttled, but it continues operating until it exits on its own"
   * (https://cloud.google.com/functions/docs/configuring/timeout). Undefined: deliveryDeadlineMs(claimLeaseMs).
   */
  readonly deliveryDeadlineMs?: number;
}

/**
 * Three quarters of the function's timeout, which terraform deploys as the claim's lease less 60 s
 * (function.tf: ORBAX2REG_CLAIM_LEASE_SECONDS = function_timeout_seconds + 60); at least 1 s.
 */
export function deliveryDeadlineMs(claimLeaseMs: number): number {
  return Math.max(1_000, Math.floor(((claimLeaseMs - 60_000) * 3) / 4));
}

/**
 * Parses the function's environment. Every value terraform can deploy is accepted, including the
 * defaults: ORBAX2REG_ROOT_PREFIXES="" (checkpoint_prefixes = [""]) watches the whole bucket.
 */
export function triggerConfigFromEnv(env: Env): TriggerHandlerConfig {
  const workflow = requiredString(env, "ORBAX2REG_WORKFLOW", {
    re: FULL_WORKFLOW_ID,
    what: "a full workflow id, projects/PROJECT/locations/REGION/workflows/NAME",
  });
  // Unset or empty: the whole bucket. Entries are trimmed; an empty entry also means the whole bucket.
  const rootPrefixes = optionalString(env, "ORBAX2REG_ROOT_PREFIXES", "")
    .split(",")
    .map((p) => p.trim());
  if (rootPrefixes.some((p) => p.startsWith("gs://"))) {
    throw new ConfigError("ORBAX2REG_ROOT_PREFIXES", env.ORBAX2REG_ROOT_PREFIXES, "entries are paths inside the bucket, without gs://");
  }
  const destinationTemplate = optionalString(env, "ORBAX2REG_DESTINATION_TEMPLATE", DEFAULT_DESTINATION_TEMPLATE);
  const unknownPlaceholder = /[{}]/.test(destinationTemplate.replaceAll(/\{(bucket|root|step)\}/g, ""));
  if (!/^gs:\/\/[^/]+(\/.*)?$/.test(destinationTemplate) || unknownPlaceholder) {
    throw new ConfigError(
      "ORBAX2REG_DESTINATION_TEMPLATE",
      destinationTemplate,
      "must be a gs://BUCKET/PATH template whose only placeholders are {bucket}, {root} and {step}",
    );
  }
  return {
    workflow,
    rootPrefixes,
    destinationTemplate,
    groups: integer(env, "ORBAX2REG_GROUPS", { min: 1, max: MAX_GROUPS, fallback: DEFAULT_GROUPS }),
    eventsTopic: eventsTopic(env),
    // Only steps divisible by this are converted (1: every step).
    convertEveryNSteps: integer(env, "ORBAX2REG_CONVERT_EVERY_N_STEPS", {
      min: 1,
      max: 99_999_999,
      fallback: DEFAULT_CONVERT_EVERY_N_STEPS,
    }),
    // Unset (not deployed by terraform): the longest lease any deployment has, which is always safe.
    claimLeaseMs: integer(env, "ORBAX2REG_CLAIM_LEASE_SECONDS", { min: 60, max: 3600, fallback: LONGEST_CLAIM_LEASE_SECONDS }) * 1000,
  };
}
