import {
  DEFAULT_CONVERT_EVERY_N_STEPS,
  DEFAULT_DESTINATION_TEMPLATE,
  DEFAULT_EXPORT_TASKS,
  DEFAULT_GROUPS,
  FULL_WORKFLOW_ID,
  LONGEST_CLAIM_LEASE_SECONDS,
  MAX_GROUPS,
} from "../../defaults.js";
import { ConfigError } from "../../errors.js";
import { type Env, eventsTopic, integer, optionalString, requiredString } from "../api/env.js";
import type { WorkflowExport } from "../api/executions.js";
import type { ExportSelection, TriggerConfig } from "./classify.js";

/** Everything the trigger function is configured with (terraform/modules/orbax2reg/function.tf). */
export interface TriggerHandlerConfig extends TriggerConfig {
  /** The export's settings besides its steps and folder, passed in every exported step's argument as they are. */
  readonly exportSettings?: Omit<WorkflowExport, "destination">;
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
  const exported = exportFromEnv(env);
  return {
    workflow,
    rootPrefixes,
    ...exported,
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

const TEMPLATE_RULE = "must be a gs://BUCKET/PATH template whose only placeholders are {bucket}, {root} and {step}";
const hasOnlyKnownPlaceholders = (t: string) => !/[{}]/.test(t.replaceAll(/\{(bucket|root|step)\}/g, ""));

/**
 * The hf_export settings (function.tf): none when ORBAX2REG_EXPORT_DESTINATION_TEMPLATE is unset or empty. The
 * template must end in {step} (one folder per step); dtype, tokenizer, shard size and tasks are checked again by the
 * plan job, as any argument's (src/cloud/job/workflow-argument.ts), and refused here already so a bad deployment
 * fails at its first event, loudly, rather than in every workflow.
 */
export function exportFromEnv(env: Env): { export?: ExportSelection; exportSettings?: Omit<WorkflowExport, "destination"> } {
  const template = optionalString(env, "ORBAX2REG_EXPORT_DESTINATION_TEMPLATE", "");
  if (template === "") return {};
  if (!/^gs:\/\/[^/]+\/.*\{step\}$/.test(template) || !hasOnlyKnownPlaceholders(template))
    throw new ConfigError("ORBAX2REG_EXPORT_DESTINATION_TEMPLATE", template, `${TEMPLATE_RULE}, ending in {step}`);
  const every = integer(env, "ORBAX2REG_EXPORT_EVERY_N_STEPS", { min: 0, max: 99_999_999, fallback: 0 });
  const listed = optionalString(env, "ORBAX2REG_EXPORT_STEPS", "");
  const steps = listed
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "")
    .map((s) => {
      if (!/^[0-9]{1,8}$/.test(s)) throw new ConfigError("ORBAX2REG_EXPORT_STEPS", listed, "must be step numbers separated by commas");
      return Number(s);
    });
  if (every === 0 && steps.length === 0)
    throw new ConfigError(
      "ORBAX2REG_EXPORT_EVERY_N_STEPS",
      env.ORBAX2REG_EXPORT_EVERY_N_STEPS,
      "or ORBAX2REG_EXPORT_STEPS must say which steps to export",
    );
  const dtype = optionalString(env, "ORBAX2REG_EXPORT_DTYPE", "bfloat16");
  if (dtype !== "bfloat16" && dtype !== "float32") throw new ConfigError("ORBAX2REG_EXPORT_DTYPE", dtype, "must be bfloat16 or float32");
  const tokenizer = optionalString(env, "ORBAX2REG_EXPORT_TOKENIZER", "");
  if (tokenizer !== "" && tokenizer !== "none" && !/^gs:\/\/[^/]+\/./.test(tokenizer))
    throw new ConfigError(
      "ORBAX2REG_EXPORT_TOKENIZER",
      tokenizer,
      'must be a gs://BUCKET/PATH file, "none", or empty (the vocabulary\'s own)',
    );
  return {
    export: { ...(every > 0 ? { everyNSteps: every } : {}), steps, destinationTemplate: template },
    exportSettings: {
      dtype,
      ...(tokenizer === "" ? {} : { tokenizer }),
      max_shard_size: optionalString(env, "ORBAX2REG_EXPORT_MAX_SHARD_SIZE", "5GB"),
      tasks: integer(env, "ORBAX2REG_EXPORT_TASKS", { min: 1, max: 10_000, fallback: DEFAULT_EXPORT_TASKS }),
    },
  };
}
