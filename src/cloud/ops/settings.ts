import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import {
  DEFAULT_DESTINATION_TEMPLATE,
  DEFAULT_FUNCTION_CPU,
  DEFAULT_FUNCTION_MAX_INSTANCES,
  DEFAULT_FUNCTION_MEMORY,
  DEFAULT_GROUP_CPU,
  DEFAULT_GROUP_MEMORY,
  DEFAULT_GROUPS,
  DEFAULT_MAX_PARALLEL_GROUPS,
  DEFAULT_WORKFLOW_NAME,
  FULL_WORKFLOW_ID,
  LONGEST_CLAIM_LEASE_SECONDS,
} from "../../defaults.js";
import { UsageError } from "../../errors.js";
import type { Env } from "../api/env.js";

/**
 * Where a deployed pipeline is, for the `orbax2reg cloud` commands. Each setting comes from the first of:
 *   1. flags (--workflow, --project, --region, --events-topic);
 *   2. the environment: ORBAX2REG_WORKFLOW (full id or name), ORBAX2REG_PROJECT or GOOGLE_CLOUD_PROJECT,
 *      ORBAX2REG_REGION, ORBAX2REG_EVENTS_TOPIC;
 *   3. `terraform output -json` when the command runs in the terraform root that deployed it
 *      (outputs workflow_id, events_topic_id, destination_template, groups, claim_lease_seconds, event_trigger and
 *      hf_export_destination_template of terraform/examples/basic);
 *   4. for the destination template and groups only: the module's defaults (src/defaults.ts).
 * The claim lease (how long a step's pending claim protects it) comes from ORBAX2REG_CLAIM_LEASE_SECONDS or the
 * terraform output claim_lease_seconds, else the longest any deployment has: a shorter guess could take a claim
 * over while the function's delivery may still start an execution.
 */
export interface CloudSettings {
  /** projects/P/locations/R/workflows/W */
  readonly workflow: string;
  /** projects/P/topics/T, when known. */
  readonly eventsTopic: string | undefined;
  /** Where a step's regular checkpoint goes: placeholders {bucket}, {root}, {step} (src/cloud/trigger/classify.ts). */
  readonly destinationTemplate: string;
  /** Parameter groups a conversion is split into. */
  readonly groups: number;
  /** The deployed function's claim lease (ORBAX2REG_CLAIM_LEASE_SECONDS). */
  readonly claimLeaseSeconds: number;
  /** The function's Eventarc trigger, projects/P/locations/L/triggers/T, when known (ORBAX2REG_EVENT_TRIGGER, terraform output event_trigger). */
  readonly eventTrigger: string | undefined;
  /**
   * hf_export's destination_template, undefined when hf_export is off or not known: ORBAX2REG_EXPORT_DESTINATION_TEMPLATE
   * (as the function has it) or terraform output hf_export_destination_template.
   */
  readonly exportDestinationTemplate: string | undefined;
}

export interface CloudFlags {
  readonly workflow?: string;
  readonly project?: string;
  readonly region?: string;
  readonly eventsTopic?: string;
  readonly destinationTemplate?: string;
  readonly groups?: number;
}

export function resolveCloudSettings(
  flags: CloudFlags,
  env: Env,
  terraformOutputs: () => Record<string, unknown> | undefined = () => readTerraformOutputs(process.cwd()),
): CloudSettings {
  let outputs: Record<string, unknown> | undefined | null = null;
  const tf = (name: string): string | undefined => {
    if (outputs === null) outputs = terraformOutputs();
    const v = outputs?.[name];
    return typeof v === "string" && v !== "" ? v : undefined;
  };
  const tfNumber = (name: string): string | undefined => {
    if (outputs === null) outputs = terraformOutputs();
    const v = outputs?.[name];
    return typeof v === "number" ? String(v) : typeof v === "string" && v !== "" ? v : undefined;
  };
  const nonEmpty = (v: string | undefined) => (v === undefined || v === "" ? undefined : v);

  let workflow = nonEmpty(flags.workflow) ?? nonEmpty(env.ORBAX2REG_WORKFLOW);
  if (workflow === undefined || !FULL_WORKFLOW_ID.test(workflow)) {
    const project = nonEmpty(flags.project) ?? nonEmpty(env.ORBAX2REG_PROJECT) ?? nonEmpty(env.GOOGLE_CLOUD_PROJECT);
    const region = nonEmpty(flags.region) ?? nonEmpty(env.ORBAX2REG_REGION);
    if (project && region) workflow = `projects/${project}/locations/${region}/workflows/${workflow ?? DEFAULT_WORKFLOW_NAME}`;
    else if (workflow === undefined) workflow = tf("workflow_id");
    else {
      throw new UsageError(
        `workflow ${JSON.stringify(workflow)} is a name, not a full id: also give --project and --region (or ORBAX2REG_PROJECT and ORBAX2REG_REGION)`,
      );
    }
  }
  if (workflow === undefined) {
    throw new UsageError(
      "which pipeline? give --workflow projects/P/locations/R/workflows/W, or --project and --region " +
        `(workflow name ${DEFAULT_WORKFLOW_NAME}), or set ORBAX2REG_WORKFLOW, or run in the terraform folder that deployed it`,
    );
  }
  const eventsTopic = nonEmpty(flags.eventsTopic) ?? nonEmpty(env.ORBAX2REG_EVENTS_TOPIC) ?? tf("events_topic_id");
  const destinationTemplate =
    nonEmpty(flags.destinationTemplate) ??
    nonEmpty(env.ORBAX2REG_DESTINATION_TEMPLATE) ??
    tf("destination_template") ??
    DEFAULT_DESTINATION_TEMPLATE;
  const groupsText = flags.groups !== undefined ? String(flags.groups) : (nonEmpty(env.ORBAX2REG_GROUPS) ?? tfNumber("groups"));
  if (groupsText !== undefined && !/^[1-9]\d*$/.test(groupsText)) {
    throw new UsageError(
      `groups must be a positive whole number, got ${JSON.stringify(groupsText)} (--groups, ORBAX2REG_GROUPS or terraform output groups)`,
    );
  }
  const leaseText = nonEmpty(env.ORBAX2REG_CLAIM_LEASE_SECONDS) ?? tfNumber("claim_lease_seconds");
  if (leaseText !== undefined && !/^[1-9]\d*$/.test(leaseText)) {
    throw new UsageError(
      `the claim lease must be a positive whole number of seconds, got ${JSON.stringify(leaseText)} (ORBAX2REG_CLAIM_LEASE_SECONDS or terraform output claim_lease_seconds)`,
    );
  }
  return {
    workflow,
    eventsTopic,
    destinationTemplate,
    groups: groupsText === undefined ? DEFAULT_GROUPS : Number(groupsText),
    claimLeaseSeconds: leaseText === undefined ? LONGEST_CLAIM_LEASE_SECONDS : Number(leaseText),
    eventTrigger: nonEmpty(env.ORBAX2REG_EVENT_TRIGGER) ?? tf("event_trigger"),
    exportDestinationTemplate: nonEmpty(env.ORBAX2REG_EXPORT_DESTINATION_TEMPLATE) ?? tf("hf_export_destination_template"),
  };
}

/** What one conversion runs at once (terraform max_parallel_groups, group_cpu, group_memory), for `cloud check`'s quota stage. */
export interface FanOutSettings {
  readonly maxParallelGroups: number;
  /** vCPU of one convert-group task. */
  readonly groupCpu: number;
  /** Memory of one convert-group task, as terraform takes it (32Gi). */
  readonly groupMemory: string;
  /** The function's instance bound, vCPU and memory (terraform function_max_instances, function_cpu, function_memory). */
  readonly functionMaxInstances: number;
  readonly functionCpu: number;
  readonly functionMemory: string;
}

/**
 * Each from ORBAX2REG_MAX_PARALLEL_GROUPS / ORBAX2REG_GROUP_CPU / ORBAX2REG_GROUP_MEMORY /
 * ORBAX2REG_FUNCTION_MAX_INSTANCES / ORBAX2REG_FUNCTION_CPU / ORBAX2REG_FUNCTION_MEMORY, else the terraform output fan_out,
 * else the module's defaults.
 */
export function resolveFanOutSettings(
  env: Env,
  terraformOutputs: () => Record<string, unknown> | undefined = () => readTerraformOutputs(process.cwd()),
): FanOutSettings {
  let outputs: Record<string, unknown> | undefined | null = null;
  const tf = (key: string): string | undefined => {
    if (outputs === null) outputs = terraformOutputs();
    const v = (outputs?.fan_out as Record<string, unknown> | undefined)?.[key];
    return typeof v === "number" || (typeof v === "string" && v !== "") ? String(v) : undefined;
  };
  const pick = (name: string, key: string) => (env[name] === undefined || env[name] === "" ? tf(key) : env[name]);
  const parallel = pick("ORBAX2REG_MAX_PARALLEL_GROUPS", "max_parallel_groups") ?? String(DEFAULT_MAX_PARALLEL_GROUPS);
  const cpu = pick("ORBAX2REG_GROUP_CPU", "group_cpu") ?? DEFAULT_GROUP_CPU;
  const memory = pick("ORBAX2REG_GROUP_MEMORY", "group_memory") ?? DEFAULT_GROUP_MEMORY;
  if (!/^[1-9]\d*$/.test(parallel))
    throw new UsageError(`max_parallel_groups must be a positive whole number, got ${JSON.stringify(parallel)}`);
  if (!/^[1-9]\d*$/.test(cpu)) throw new UsageError(`group_cpu must be a whole number of vCPUs, got ${JSON.stringify(cpu)}`);
  if (!/^\d+(Mi|Gi|M|G)$/.test(memory)) throw new UsageError(`group_memory must look like 32Gi or 8192Mi, got ${JSON.stringify(memory)}`);
  const fnInstances = pick("ORBAX2REG_FUNCTION_MAX_INSTANCES", "function_max_instances") ?? String(DEFAULT_FUNCTION_MAX_INSTANCES);
  const fnCpu = pick("ORBAX2REG_FUNCTION_CPU", "function_cpu") ?? DEFAULT_FUNCTION_CPU;
  const fnMemory = pick("ORBAX2REG_FUNCTION_MEMORY", "function_memory") ?? DEFAULT_FUNCTION_MEMORY;
  if (!/^[1-9]\d*$/.test(fnInstances))
    throw new UsageError(`function_max_instances must be a positive whole number, got ${JSON.stringify(fnInstances)}`);
  if (!/^[1-9]\d*$/.test(fnCpu)) throw new UsageError(`function_cpu must be a whole number of vCPUs, got ${JSON.stringify(fnCpu)}`);
  if (!/^\d+(Mi|Gi|M|G)$/.test(fnMemory)) throw new UsageError(`function_memory must look like 512Mi, got ${JSON.stringify(fnMemory)}`);
  return {
    maxParallelGroups: Number(parallel),
    groupCpu: Number(cpu),
    groupMemory: memory,
    functionMaxInstances: Number(fnInstances),
    functionCpu: Number(fnCpu),
    functionMemory: fnMemory,
  };
}

/** Outputs of the terraform root in `dir`, or undefined when it is none (or terraform is not installed). */
export function readTerraformOutputs(dir: string): Record<string, unknown> | undefined {
  if (!existsSync(join(dir, ".terraform")) && !existsSync(join(dir, "terraform.tfstate"))) return undefined;
  const r = spawnSync("terraform", ["output", "-json"], { cwd: dir, encoding: "utf8", timeout: 60_000 });
  if (r.status !== 0) return undefined;
  try {
    const parsed = JSON.parse(r.stdout) as Record<string, { value?: unknown }>;
    return Object.fromEntries(Object.entries(parsed).map(([k, v]) => [k, v.value]));
  } catch {
    return undefined;
  }
}
