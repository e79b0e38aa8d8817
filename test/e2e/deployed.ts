// What terraform deploys, for the end-to-end test: the function's environment_variables, the workflow's
// user_env_vars and each Cloud Run job's static env (jobs.tf: its dynamic "env" block's for_each, for every instance of
// the job resource's own for_each), evaluated by the real terraform from the files in terraform/ for the example root's
// defaults (plus the tfvars a test gives), never retyped here. So a default the code rejects fails a test.
//
// How: the example's `module "orbax2reg"` block and locals (read with hcl2json) call a scratch copy of the module
// made of its variables.tf and main.tf (variables and locals only: no resources, so no provider is needed)
// plus jobs.tf's locals and outputs holding the maps' expressions exactly as written. The few resource attributes those
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
  // google_cloud_run_v2_job (one instance per phase): name is the configured name
  'google_cloud_run_v2_job.phase["plan"].name': "local.names.plan_job",
  'google_cloud_run_v2_job.phase["convert-group"].name': "local.names.group_job",
  'google_cloud_run_v2_job.phase["finalize"].name': "local.names.finalize_job",
};

export interface Deployed {
  /** The function's environment_variables. */
  readonly functionEnv: Record<string, string>;
  /** The workflow's user_env_vars. */
  readonly workflowEnv: Record<string, string>;
  /** The workflow's name (its id's last segment). */
  readonly workflowName: string;
  /** Each job's static env by phase (plan, convert-group, finalize), under the workflow's per-execution overrides. */
  readonly jobEnv: Record<string, Record<string, string>>;
  /** The flags of the jobs' container `command` after `node` (jobs.tf), which the hook starts each task with. */
  readonly jobNodeArgs: readonly string[];
  /** The jobs' max_retries (jobs.tf's task template): how often Cloud Run runs a task that exits non-zero again. */
  readonly jobMaxRetries: number;
}

type Obj = Record<string, unknown>;
const block = async (file: string): Promise<Obj> => (await parse(file, readFileSync(file, "utf8"))) as Obj;
const first = (v: unknown): Obj => (Array.isArray(v) ? v[0] : v) as Obj;

/** Rewrites resource references in a map of "${...}" expressions (nested maps too) into the provider's values. */
function substitute(map: Obj, where: string): Obj {
  const out: Obj = {};
  for (const [k, v] of Object.entries(map)) {
    if (typeof v === "object" && v !== null && !Array.isArray(v)) {
      out[k] = substitute(v as Obj, `${where}.${k}`);
      continue;
    }
    // type.name.attribute, or type.name["key"].attribute for an instance of a for_each resource.
    out[k] = String(v).replace(/\b(google_[a-z0-9_]+\.[a-z0-9_]+(?:\["[a-z0-9_-]+"\])?\.[a-z0-9_]+)\b/g, (ref) => {
      const value = PROVIDER_VALUES[ref];
      if (value === undefined) throw new Error(`${where}.${k} references ${ref}: add its provider value to test/e2e/deployed.ts`);
      return `(${value})`;
    });
  }
  return out;
}

/**
 * Evaluates what the example root deploys with these tfvars (on top of its defaults), its module block given
 * `moduleArgs` besides its own (module variables the example does not expose, as a user would set them there).
 */
export async function deployedSettings(tfvars: Record<string, unknown>, moduleArgs: Record<string, unknown> = {}): Promise<Deployed> {
  const fn = first(
    first(first(first((await block(`${MODULE}/function.tf`)).resource as Obj).google_cloudfunctions2_function).on_checkpoint),
  );
  const functionEnv = first((first(fn.service_config) as Obj).environment_variables);
  const wf = first(first(first((await block(`${MODULE}/workflow.tf`)).resource as Obj).google_workflows_workflow).convert);
  const workflowEnv = first(wf.user_env_vars);
  const exampleMain = await block(`${EXAMPLE}/main.tf`);
  // The example's module block, with the one resource attribute it references (the bucket it creates for the regular
  // checkpoints) replaced by what hashicorp/google sets it to: the configured name, local.destination_bucket.
  const moduleCall = JSON.parse(
    JSON.stringify(first(first(exampleMain.module as Obj).orbax2reg)).replaceAll(
      "google_storage_bucket.regular[0].name",
      "local.destination_bucket",
    ),
  ) as Obj;
  if (/google_[a-z0-9_]+\./.test(JSON.stringify(moduleCall)))
    throw new Error(`${EXAMPLE}/main.tf: the module block references a resource deployed.ts does not know`);
  const exampleLocals: Obj = Object.assign({}, ...((exampleMain.locals ?? []) as Obj[]));
  // Each job's env is its container's dynamic "env" for_each, over jobs.tf's locals; its phase is its second arg.
  // A job resource with a for_each (google_cloud_run_v2_job.phase, over local.jobs) is one job per instance: both are
  // evaluated for each of its keys, each.key and each.value bound by a for expression.
  const jobsTf = await block(`${MODULE}/jobs.tf`);
  const jobLocals: Obj = Object.assign({}, ...((jobsTf.locals ?? []) as Obj[]));
  const jobs = first(first(jobsTf.resource as Obj).google_cloud_run_v2_job);
  const jobEnvMaps: string[] = [];
  let jobNodeArgs: string[] | undefined;
  let maxRetries: string | undefined;
  for (const [name, body] of Object.entries(jobs)) {
    const job = first(body);
    const container = first(first(first(job.template).template).containers);
    const command = container.command as unknown[];
    if (!Array.isArray(command) || command[0] !== "node" || command.some((c) => typeof c !== "string" || c.includes("${")))
      throw new Error(`jobs.tf: job ${name}'s command is not a literal ["node", flags...]`);
    jobNodeArgs = command.slice(1) as string[];
    maxRetries = String(first(first(job.template).template).max_retries);
    const phase = (container.args as unknown[])[1];
    const forEach = first(first(container.dynamic).env).for_each;
    if (typeof phase !== "string" || typeof forEach !== "string")
      throw new Error(`jobs.tf: job ${name} has no phase argument or no dynamic "env" block`);
    const expression = (v: string) => (/^\$\{(.*)\}$/s.exec(v)?.[1] ?? JSON.stringify(v)).replace(/\beach\.(key|value)\b/g, "each_$1");
    if (/\$\{/.test(phase) && !/^\$\{[^$]*\}$/s.test(phase))
      throw new Error(`jobs.tf: job ${name}'s phase argument ${phase} is a template`);
    const entry = `(${expression(phase)}) => ${expression(forEach)}`;
    jobEnvMaps.push(
      job.for_each === undefined ? `{ ${entry} }` : `{ for each_key, each_value in ${expression(String(job.for_each))} : ${entry} }`,
    );
  }

  const dir = tempDir("deployed");
  mkdirSync(join(dir, "module"));
  copyFileSync(`${EXAMPLE}/variables.tf`, join(dir, "variables.tf"));
  copyFileSync(`${MODULE}/variables.tf`, join(dir, "module/variables.tf"));
  copyFileSync(`${MODULE}/main.tf`, join(dir, "module/main.tf"));
  writeFileSync(
    join(dir, "module/probe.tf.json"),
    JSON.stringify({
      locals: substitute(jobLocals, "jobs.tf locals"),
      output: {
        job_env: substitute({ value: `\${merge(${jobEnvMaps.join(", ")})}` }, "jobs.tf job env"),
        function_env: { value: substitute(functionEnv, "function.tf environment_variables") },
        workflow_env: { value: substitute(workflowEnv, "workflow.tf user_env_vars") },
        workflow_name: { value: `\${local.names.workflow}` },
        job_max_retries: { value: maxRetries },
      },
    }),
  );
  writeFileSync(
    join(dir, "main.tf.json"),
    JSON.stringify({
      locals: exampleLocals,
      module: { orbax2reg: { ...moduleCall, ...moduleArgs, source: "./module" } },
      output: Object.fromEntries(
        ["function_env", "workflow_env", "workflow_name", "job_env", "job_max_retries"].map((o) => [
          o,
          { value: `\${module.orbax2reg.${o}}` },
        ]),
      ),
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
    jobEnv: values.job_env as Record<string, Record<string, string>>,
    jobNodeArgs: jobNodeArgs ?? [],
    jobMaxRetries: Number(values.job_max_retries),
  };
}

/** A workflows directory for the emulator holding workflows/convert.yaml under the deployed workflow's name. */
export function workflowsDir(workflowName: string): string {
  const dir = tempDir("workflows");
  symlinkSync(resolve("workflows/convert.yaml"), join(dir, `${workflowName}.yaml`));
  return dir;
}
