import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { UsageError } from "../../errors.js";
import type { Env } from "../api/env.js";

/**
 * Where a deployed pipeline is, for the `orbax2reg cloud` commands. Each setting comes from the first of:
 *   1. flags (--workflow, --project, --region, --events-topic);
 *   2. the environment: ORBAX2REG_WORKFLOW (full id or name), ORBAX2REG_PROJECT or GOOGLE_CLOUD_PROJECT,
 *      ORBAX2REG_REGION, ORBAX2REG_EVENTS_TOPIC;
 *   3. `terraform output -json` when the command runs in the terraform root that deployed it
 *      (outputs workflow_id, events_topic_id, destination_template and groups of terraform/examples/basic);
 *   4. for the destination template and groups only: the module's defaults.
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
}

export interface CloudFlags {
  readonly workflow?: string;
  readonly project?: string;
  readonly region?: string;
  readonly eventsTopic?: string;
  readonly destinationTemplate?: string;
  readonly groups?: number;
}

/** terraform/modules/orbax2reg's defaults for destination_template and groups. */
export const DEFAULT_DESTINATION_TEMPLATE = "gs://{bucket}/{root}/regular";
export const DEFAULT_GROUPS = 8;

/** The default workflow name (terraform's name_prefix "orbax2reg" + "-convert"). */
export const DEFAULT_WORKFLOW_NAME = "orbax2reg-convert";
const FULL_WORKFLOW = /^projects\/[^/]+\/locations\/[^/]+\/workflows\/[^/]+$/;

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
  if (workflow === undefined || !FULL_WORKFLOW.test(workflow)) {
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
  return { workflow, eventsTopic, destinationTemplate, groups: groupsText === undefined ? DEFAULT_GROUPS : Number(groupsText) };
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
