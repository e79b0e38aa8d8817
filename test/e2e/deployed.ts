// What terraform deploys, for the end-to-end test: the function's environment_variables and the workflow's
// user_env_vars, evaluated by the real terraform from the files in terraform/ for the example root's
// defaults (plus the tfvars a test gives), never retyped here. So a default the code rejects fails a test.
//
// How: the example's `module "orbax2reg"` block (read with hcl2json) calls a scratch copy of the module
// made of its variables.tf and main.tf (variables and locals only: no resources, so no provider is needed)
// plus outputs holding the two maps' expressions exactly as written. The few resource attributes those
// maps reference are replaced by the values the google provider gives them (documented id formats).
import { copyFileSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { parse } from "@cdktf/hcl2json";
import { applyForOutputs, terraform } from "../helpers/terraform.js";
import { tempDir } from "../helpers/tmp.js";

const MODULE = "terraform/modules/orbax2reg";
const EXAMPLE = "terraform/examples/basic";

/**
 * Resource attributes the environment maps may reference, as terraform expressions over the module's
 * variables and locals: what hashicorp/google sets them to. An attribute missing here fails loudly.
 */
const PROVIDER_VALUES: Record<string, string> = {
  // google_workflows_workflow: id = projects/{{project}}/locations/{{region}}/workflows/{{name}}
  "google_workflows_workflow.convert.id": `"projects/\${var.project_id}/locations/\${var.region}/workflows/\${local.names.workflow}"`,
  "google_workflows_workflow.convert.name": "local.names.workflow",
  // google_pubsub_topic: id = projects/{{project}}/topics/{{name}}
  "google_pubsub_topic.events.id": `"projects/\${var.project_id}/topics/\${var.events_topic_name}"`,
  "google_pubsub_topic.events.name": "var.events_topic_name",
  // google_cloud_run_v2_job: name is the configured name
  "google_cloud_run_v2_job.plan.name": "local.names.plan_job",
  "google_cloud_run_v2_job.convert_group.name": "local.names.group_job",
  "google_cloud_run_v2_job.finalize.name": "local.names.finalize_job",
};

export interface Deployed {
  /** The function's environment_variables. */
  readonly functionEnv: Record<string, string>;
  /** The workflow's user_env_vars. */
  readonly workflowEnv: Record<string, string>;
  /** The workflow's name (its id's last segment). */
  readonly workflowName: string;
}

type Obj = Record<string, unknown>;
const block = async (file: string): Promise<Obj> => (await parse(file, readFileSync(file, "utf8"))) as Obj;
const first = (v: unknown): Obj => (Array.isArray(v) ? v[0] : v) as Obj;

/** Rewrites resource references in a map of "${...}" expressions into the provider's values. */
function substitute(map: Obj, where: string): Obj {
  const out: Obj = {};
  for (const [k, v] of Object.entries(map)) {
    out[k] = String(v).replace(/\b(google_[a-z0-9_]+\.[a-z0-9_]+\.[a-z0-9_]+)\b/g, (ref) => {
      const value = PROVIDER_VALUES[ref];
      if (value === undefined) throw new Error(`${where}.${k} references ${ref}: add its provider value to test/e2e/deployed.ts`);
      return `(${value})`;
    });
  }
  return out;
}

/** Evaluates what the example root deploys with these tfvars (on top of its defaults). */
export async function deployedSettings(tfvars: Record<string, unknown>): Promise<Deployed> {
  const fn = first(
    first(first(first((await block(`${MODULE}/function.tf`)).resource as Obj).google_cloudfunctions2_function).on_checkpoint),
  );
  const functionEnv = first((first(fn.service_config) as Obj).environment_variables);
  const wf = first(first(first((await block(`${MODULE}/workflow.tf`)).resource as Obj).google_workflows_workflow).convert);
  const workflowEnv = first(wf.user_env_vars);
  const moduleCall = first(first((await block(`${EXAMPLE}/main.tf`)).module as Obj).orbax2reg);

  const dir = tempDir("deployed");
  mkdirSync(join(dir, "module"));
  copyFileSync(`${EXAMPLE}/variables.tf`, join(dir, "variables.tf"));
  copyFileSync(`${MODULE}/variables.tf`, join(dir, "module/variables.tf"));
  copyFileSync(`${MODULE}/main.tf`, join(dir, "module/main.tf"));
  writeFileSync(
    join(dir, "module/probe.tf.json"),
    JSON.stringify({
      output: {
        function_env: { value: substitute(functionEnv, "function.tf environment_variables") },
        workflow_env: { value: substitute(workflowEnv, "workflow.tf user_env_vars") },
        workflow_name: { value: `\${local.names.workflow}` },
      },
    }),
  );
  writeFileSync(
    join(dir, "main.tf.json"),
    JSON.stringify({
      module: { orbax2reg: { ...moduleCall, source: "./module" } },
      output: Object.fromEntries(["function_env", "workflow_env", "workflow_name"].map((o) => [o, { value: `\${module.orbax2reg.${o}}` }])),
    }),
  );
  writeFileSync(join(dir, "test.tfvars.json"), JSON.stringify(tfvars));
  const init = terraform(["init", "-backend=false", "-input=false"], dir);
  if (init.code !== 0) throw new Error(`terraform init: ${init.out}`);
  const apply = applyForOutputs(dir, ["-var-file=test.tfvars.json"]);
  if (apply.code !== 0) throw new Error(`terraform apply: ${apply.out}`);
  const values = apply.outputs;
  return {
    functionEnv: values.function_env as Record<string, string>,
    workflowEnv: values.workflow_env as Record<string, string>,
    workflowName: values.workflow_name as string,
  };
}

/** A workflows directory for the emulator holding workflows/convert.yaml under the deployed workflow's name. */
export function workflowsDir(workflowName: string): string {
  const dir = tempDir("workflows");
  symlinkSync(resolve("workflows/convert.yaml"), join(dir, `${workflowName}.yaml`));
  return dir;
}
