// Structural checks of the Terraform in terraform/: every .tf file is parsed with @cdktf/hcl2json (HCL -> JSON, no
// provider schema needed) and the pipeline's contract is asserted on the result: the function's trigger, the
// workflow's source and configuration, the three jobs, the IAM bindings, the APIs, versions and documentation.
// In the JSON, blocks are arrays (`resource.<type>.<name>` is the block, `.event_trigger[0]` a nested block) and
// expressions are "${...}" strings (built here with `ex()`).
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import { parse } from "@cdktf/hcl2json";
import { beforeAll, describe, expect, test } from "vitest";
import { CLAIM_KEY } from "../../src/convert/work-dir.js";
import { type AlertPolicy, moduleDashboard, TRIGGER_ID } from "../helpers/dashboard-json.js";

const TERRAFORM = "terraform";
const MODULE = `${TERRAFORM}/modules/orbax2reg`;
const EXAMPLE = `${TERRAFORM}/examples/basic`;

type Obj = Record<string, unknown>;

/** One Terraform directory, merged over its .tf files: `resource[type][name]` is the block's body. */
interface TfDir {
  files: string[];
  resource: Record<string, Record<string, Obj>>;
  data: Record<string, Record<string, Obj>>;
  variable: Record<string, Obj>;
  output: Record<string, Obj>;
  module: Record<string, Obj>;
  locals: Obj;
  moved: Obj[];
  terraform: Obj[];
}

/** How hcl2json renders a Terraform expression: `ex("var.region")` is the string "${var.region}". */
const ex = (expression: string): string => `\${${expression}}`;
/** The inverse: "${var.region}" is "var.region". */
const bare = (expr: unknown) => String(expr).replace(/^\$\{(.*)\}$/s, "$1");

const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);

/** Walks object keys and array indexes; undefined when the path does not exist. */
function at(v: unknown, ...path: (string | number)[]): unknown {
  let cur = v;
  for (const k of path) {
    if (typeof k === "number") cur = Array.isArray(cur) ? cur[k] : undefined;
    else cur = isObj(cur) ? cur[k] : undefined;
  }
  return cur;
}

function tfFiles(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory() && e.name !== ".terraform") out.push(...tfFiles(p));
    else if (e.isFile() && e.name.endsWith(".tf")) out.push(p);
  }
  return out.sort();
}

/** A block label must be unique per directory; a single-instance block comes back as a one-element array. */
function single(v: unknown, where: string): Obj {
  if (!Array.isArray(v) || v.length !== 1 || !isObj(v[0])) throw new Error(`${where}: expected exactly one block`);
  return v[0];
}

async function loadDir(dir: string): Promise<TfDir> {
  const files = readdirSync(dir)
    .filter((f) => f.endsWith(".tf"))
    .map((f) => join(dir, f));
  const merged: TfDir = { files, resource: {}, data: {}, variable: {}, output: {}, module: {}, locals: {}, moved: [], terraform: [] };
  for (const file of files) {
    const json = await parse(file, readFileSync(file, "utf8"));
    for (const kind of ["resource", "data"] as const) {
      for (const [type, byName] of Object.entries((json[kind] ?? {}) as Record<string, Obj>)) {
        merged[kind][type] ??= {};
        for (const [name, blocks] of Object.entries(byName)) {
          if (merged[kind][type][name]) throw new Error(`${kind} ${type}.${name} defined twice in ${dir}`);
          merged[kind][type][name] = single(blocks, `${file}: ${kind} ${type}.${name}`);
        }
      }
    }
    for (const kind of ["variable", "output", "module"] as const) {
      for (const [name, blocks] of Object.entries((json[kind] ?? {}) as Obj)) {
        if (merged[kind][name]) throw new Error(`${kind} ${name} defined twice in ${dir}`);
        merged[kind][name] = single(blocks, `${file}: ${kind} ${name}`);
      }
    }
    for (const l of (json.locals ?? []) as Obj[]) Object.assign(merged.locals, l);
    merged.moved.push(...((json.moved ?? []) as Obj[]));
    merged.terraform.push(...((json.terraform ?? []) as Obj[]));
  }
  return merged;
}

function resource(dir: TfDir, type: string, name: string): Obj {
  const r = dir.resource[type]?.[name];
  if (!r) throw new Error(`resource ${type}.${name} is missing`);
  return r;
}

/**
 * One instance of a `for_each = local.<map>` resource: its body with `each.key` and `each.value.<attribute>` (of
 * local.<map>[key]) put in, i.e. what hcl2json gives for the same block written out for that key alone.
 */
function instance(dir: TfDir, type: string, name: string, key: string): Obj {
  const r = resource(dir, type, name);
  const map = /^local\.(\w+)$/.exec(bare(r.for_each))?.[1];
  // A local that merges literal maps (local.jobs: the conversion's jobs and, with hf_export, the export job): the key's
  // entry in the one of them that has it.
  const merged = (m: string): unknown => {
    const v = at(dir.locals, m);
    if (isObj(v)) return v[key];
    const parts = [...bare(v).matchAll(/\blocal\.(\w+)/g)].map((x) => at(dir.locals, x[1] as string));
    return parts.find((p) => isObj(p) && isObj(p[key]))?.[key as never];
  };
  const values = map === undefined ? undefined : merged(map);
  if (!isObj(values)) throw new Error(`resource ${type}.${name}: no local.<map> for_each with the key ${key}`);
  const put = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(put);
    if (isObj(v)) return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, put(x)]));
    if (typeof v !== "string") return v;
    const out = v
      .replace(/\$\{each\.key\}/g, key)
      .replace(/\$\{each\.value\.(\w+)\}/g, (_, attribute: string) => {
        if (!(attribute in values)) throw new Error(`resource ${type}.${name}: local.${map}["${key}"] has no ${attribute}`);
        return String(values[attribute]);
      })
      .replace(/\beach\.key\b/g, JSON.stringify(key));
    if (/\beach\./.test(out)) throw new Error(`resource ${type}.${name}: cannot put in each.* in ${v}`);
    return out;
  };
  const { for_each: _, ...body } = r;
  return put(body) as Obj;
}

let mod: TfDir;
let example: TfDir;

beforeAll(async () => {
  mod = await loadDir(MODULE);
  example = await loadDir(EXAMPLE);
});

describe("terraform files", () => {
  test("every .tf file under terraform/ is valid HCL", async () => {
    const files = tfFiles(TERRAFORM);
    expect(files.length).toBeGreaterThan(10);
    for (const f of files) await expect(parse(f, readFileSync(f, "utf8")), f).resolves.toBeTypeOf("object");
  });

  test("the module is split into one file per service", () => {
    const names = mod.files.map((f) => relative(MODULE, f)).sort();
    expect(names).toEqual(
      expect.arrayContaining([
        "apis.tf",
        "artifact_registry.tf",
        "build.tf",
        "function.tf",
        "iam.tf",
        "jobs.tf",
        "main.tf",
        "outputs.tf",
        "pubsub.tf",
        "sources.tf",
        "variables.tf",
        "versions.tf",
        "workflow.tf",
      ]),
    );
  });
});

describe("Cloud Function", () => {
  const fn = () => resource(mod, "google_cloudfunctions2_function", "on_checkpoint");

  test("is triggered by google.cloud.storage.object.v1.finalized", () => {
    expect(at(fn(), "event_trigger", 0, "event_type")).toBe("google.cloud.storage.object.v1.finalized");
  });

  test("watches exactly the checkpoint bucket", () => {
    expect(at(fn(), "event_trigger", 0, "event_filters")).toEqual([{ attribute: "bucket", value: ex("var.checkpoint_bucket") }]);
  });

  test("retries failed deliveries (RETRY_POLICY_RETRY)", () => {
    expect(at(fn(), "event_trigger", 0, "retry_policy")).toBe("RETRY_POLICY_RETRY");
  });

  test("delivers events as the dedicated trigger service account", () => {
    expect(at(fn(), "event_trigger", 0, "service_account_email")).toBe(ex("google_service_account.trigger.email"));
  });

  test("is built by the dedicated build account (or the one given) into the module's own repository", () => {
    expect(at(fn(), "build_config", 0, "service_account")).toBe(ex("local.build_service_account"));
    expect(String(mod.locals.build_service_account)).toBe(
      ex("var.function_build_service_account != null ? var.function_build_service_account : one(google_service_account.build[*].id)"),
    );
    expect(at(fn(), "build_config", 0, "docker_repository")).toBe(ex('google_artifact_registry_repository.docker["function_builds"].id'));
    const repo = instance(mod, "google_artifact_registry_repository", "docker", "function_builds");
    expect(repo.format).toBe("DOCKER");
    expect(repo.repository_id).toBe(ex("local.names.function_repository"));
    expect(at(mod.locals.names, "function_repository")).toBe(`${ex("var.name_prefix")}-function-builds`);
    // The build's roles exist before the function (and its first build) is created.
    const deps = (fn().depends_on ?? []) as string[];
    for (const d of [
      "google_project_iam_member.build_log_writer",
      "google_artifact_registry_repository_iam_member.build_writes_function_images",
      "google_project_iam_member.build_reads_function_source",
    ])
      expect(deps.map(bare), d).toContain(d);
  });

  test("runs onCheckpointFinalized on nodejs22 from the source archive the module uploads (or a prebuilt one given)", () => {
    expect(at(fn(), "build_config", 0, "runtime")).toBe("nodejs22");
    expect(at(fn(), "build_config", 0, "entry_point")).toBe("onCheckpointFinalized");
    expect(at(fn(), "build_config", 0, "source", 0, "storage_source", 0)).toEqual({
      bucket: ex("local.function_source_bucket"),
      object: ex("local.function_source_object"),
    });
    expect(String(mod.locals.function_source_bucket)).toBe(
      ex("var.function_source_bucket != null ? var.function_source_bucket : google_storage_bucket.sources.name"),
    );
    expect(String(mod.locals.function_source_object)).toBe(
      ex("var.function_source_object != null ? var.function_source_object : one(google_storage_bucket_object.function_source[*].name)"),
    );
    const conditions = (at(fn(), "lifecycle", 0, "precondition") as Obj[]).map((p) => p.condition);
    expect(conditions).toContain(ex("local.function_source_given"));
  });

  test("the module zips the function's sources itself and uploads them under their identity, unless given a prebuilt object", () => {
    const archive = mod.data.archive_file?.function_source as Obj;
    expect(archive.count).toBe(ex("var.function_source_object == null ? 1 : 0"));
    expect(archive.type).toBe("zip");
    expect(at(archive, "dynamic", "source", 0, "for_each")).toBe(ex("local.function_source_files"));
    expect(at(archive, "source", 0)).toEqual({ filename: "package.json", content: ex("local.function_package_json") });
    expect(at(archive, "source", 1)).toEqual({ filename: "package-lock.json", content: ex("local.function_package_lock") });
    const upload = resource(mod, "google_storage_bucket_object", "function_source");
    expect(upload.count).toBe(ex("var.function_source_object == null ? 1 : 0"));
    expect(upload.bucket).toBe(ex("google_storage_bucket.sources.name"));
    expect(upload.name).toBe(ex("local.function_source_object_name"));
    expect(upload.source).toBe(ex("data.archive_file.function_source[0].output_path"));
    expect(String(mod.locals.function_source_object_name)).toBe(`orbax2reg/function-${ex("substr(local.function_source_id, 0, 16)")}.zip`);
  });

  test("the sources bucket is the module's own: uniform access, never public, build contexts expire", () => {
    const bucket = resource(mod, "google_storage_bucket", "sources");
    expect(bucket.name).toBe(ex("local.names.sources_bucket"));
    expect(at(mod.locals.names, "sources_bucket")).toBe(`${ex("var.project_id")}-${ex("var.name_prefix")}-sources`);
    expect(bucket.uniform_bucket_level_access).toBe(true);
    expect(bucket.public_access_prevention).toBe("enforced");
    expect(at(bucket, "lifecycle_rule", 0, "condition", 0, "matches_prefix")).toEqual([`${ex("local.image_build_staging_prefix")}/`]);
  });

  test("takes many events per instance: request concurrency from a validated variable, on at least one vCPU", () => {
    // A concurrency above 1 needs a whole vCPU: https://cloud.google.com/functions/docs/configuring/concurrency.
    const service = at(fn(), "service_config", 0) as Obj;
    expect(service.max_instance_request_concurrency).toBe(ex("var.function_concurrency"));
    expect(service.available_cpu).toBe(ex("var.function_cpu"));
    expect(service.available_memory).toBe(ex("var.function_memory"));
    expect(mod.variable.function_concurrency?.default).toBe(80);
    expect(String(at(mod.variable.function_concurrency, "validation", 0, "condition"))).toContain("var.function_concurrency <= 1000");
    expect(mod.variable.function_cpu?.default).toBe("1");
    expect(String(at(mod.variable.function_cpu, "validation", 0, "condition"))).toBe(
      ex('contains(["1", "2", "4", "6", "8"], var.function_cpu)'),
    );
    expect(mod.variable.function_memory?.default).toBe("512Mi");
    const conditions = (at(fn(), "lifecycle", 0, "precondition") as Obj[]).map((p) => p.condition);
    expect(conditions).toContain(ex("local.function_shape_ok"));
  });

  test("gets the workflow, prefixes, destination template, topic, group count and claim lease as environment variables", () => {
    expect(at(fn(), "service_config", 0, "environment_variables")).toEqual({
      ORBAX2REG_WORKFLOW: ex("google_workflows_workflow.convert.id"),
      ORBAX2REG_ROOT_PREFIXES: ex('join(",", var.checkpoint_prefixes)'),
      ORBAX2REG_DESTINATION_TEMPLATE: ex("var.destination_template"),
      ORBAX2REG_EVENTS_TOPIC: ex("google_pubsub_topic.events.id"),
      ORBAX2REG_GROUPS: ex("tostring(var.groups)"),
      ORBAX2REG_CLAIM_LEASE_SECONDS: ex("tostring(var.function_timeout_seconds + 60)"),
      ORBAX2REG_CONVERT_EVERY_N_STEPS: ex("tostring(var.convert_every_n_steps)"),
      ORBAX2REG_EXPORT_DESTINATION_TEMPLATE: ex('local.export_on ? var.hf_export.destination_template : ""'),
      ORBAX2REG_EXPORT_EVERY_N_STEPS: ex('local.export_on ? tostring(coalesce(var.hf_export.every_n_steps, 0)) : ""'),
      ORBAX2REG_EXPORT_STEPS: ex('local.export_on ? join(",", [for s in var.hf_export.steps : tostring(s)]) : ""'),
      ORBAX2REG_EXPORT_DTYPE: ex('local.export_on ? var.hf_export.dtype : ""'),
      ORBAX2REG_EXPORT_TOKENIZER: ex('local.export_on ? (var.hf_export.tokenizer == null ? "" : var.hf_export.tokenizer) : ""'),
      ORBAX2REG_EXPORT_MAX_SHARD_SIZE: ex('local.export_on ? var.hf_export.max_shard_size : ""'),
      ORBAX2REG_EXPORT_TASKS: ex('local.export_on ? tostring(var.hf_export.tasks) : ""'),
    });
  });

  test("exports nothing unless hf_export is set (default null: every export variable empty)", () => {
    const v = mod.variable.hf_export;
    expect(v && "default" in v && v.default === null).toBe(true);
    expect(mod.locals.export_on).toBe(ex("var.hf_export != null"));
  });

  test("converts every step by default (convert_every_n_steps = 1, never null)", () => {
    const v = mod.variable.convert_every_n_steps;
    expect(v?.default).toBe(1);
    expect(v?.type).toBe(ex("number"));
    expect(v?.nullable).toBe(false);
  });

  test("the destination template's placeholders {bucket}, {root}, {step} are documented", () => {
    const description = String(mod.variable.destination_template?.description);
    for (const p of ["{bucket}", "{root}", "{step}"]) expect(description).toContain(p);
    const readme = readFileSync(`${TERRAFORM}/README.md`, "utf8");
    for (const p of ["{bucket}", "{root}", "{step}"]) expect(readme).toContain(p);
  });

  test("the Cloud Storage service agent may publish events (roles/pubsub.publisher)", () => {
    expect(mod.data.google_storage_project_service_account?.gcs).toBeDefined();
    const b = resource(mod, "google_project_iam_member", "gcs_agent_pubsub_publisher");
    expect(b.role).toBe("roles/pubsub.publisher");
    expect(b.member).toBe(`serviceAccount:${ex("data.google_storage_project_service_account.gcs.email_address")}`);
  });
});

describe("Workflow", () => {
  const wf = () => resource(mod, "google_workflows_workflow", "convert");

  test("reads its definition from the repository's workflows/convert.yaml", () => {
    expect(wf().source_contents).toBe(ex("file(local.workflow_source_path)"));
    expect(String(mod.locals.workflow_source_path)).toContain(`${ex("path.module")}/../../../workflows/convert.yaml`);
    expect(mod.variable.workflow_source_path?.default).toBeNull();
    // path.module/../../.. is the repository root.
    expect(resolve(MODULE, "../../../workflows/convert.yaml")).toBe(resolve("workflows/convert.yaml"));
  });

  test("deploys the YAML verbatim (file(), not templatefile(), so no $${} escaping)", async () => {
    const expressions: string[] = [];
    const walk = (v: unknown): void => {
      if (typeof v === "string" && /^\$\{/.test(v)) expressions.push(v);
      else if (Array.isArray(v)) v.forEach(walk);
      else if (isObj(v)) Object.values(v).forEach(walk);
    };
    for (const f of tfFiles(TERRAFORM)) walk(await parse(f, readFileSync(f, "utf8")));
    expect(expressions.length).toBeGreaterThan(50);
    expect(expressions.filter((e) => /templatefile\s*\(/.test(e))).toEqual([]);
    if (existsSync("workflows/convert.yaml")) expect(readFileSync("workflows/convert.yaml", "utf8")).not.toContain("$${");
  });

  test("passes its configuration through user_env_vars", () => {
    expect(wf().user_env_vars).toEqual({
      ORBAX2REG_PROJECT: ex("var.project_id"),
      ORBAX2REG_REGION: ex("var.region"),
      ORBAX2REG_PLAN_JOB: ex('google_cloud_run_v2_job.phase["plan"].name'),
      ORBAX2REG_GROUP_JOB: ex('google_cloud_run_v2_job.phase["convert-group"].name'),
      ORBAX2REG_FINALIZE_JOB: ex('google_cloud_run_v2_job.phase["finalize"].name'),
      ORBAX2REG_EXPORT_JOB: ex("local.names.export_job"),
      ORBAX2REG_EVENTS_TOPIC: ex("google_pubsub_topic.events.id"),
      ORBAX2REG_MAX_PARALLEL_GROUPS: ex("tostring(var.max_parallel_groups)"),
      ORBAX2REG_GROUPS: ex("tostring(var.groups)"),
      ORBAX2REG_JOB_TIMEOUT: ex("tostring(local.job_timeout_seconds)"),
    });
  });

  test("sets exactly the ORBAX2REG_* variables workflows/convert.yaml reads", () => {
    const read = new Set([...readFileSync("workflows/convert.yaml", "utf8").matchAll(/sys\.get_env\("(ORBAX2REG_\w+)"/g)].map((m) => m[1]));
    expect(Object.keys(wf().user_env_vars as Obj).sort()).toEqual([...read].sort());
  });

  test("max_parallel_groups is validated to 1..20 (Workflows' limit on parallel branches)", () => {
    const v = mod.variable.max_parallel_groups;
    const condition = String(at(v, "validation", 0, "condition"));
    expect(condition).toContain("var.max_parallel_groups >= 1");
    expect(condition).toContain("var.max_parallel_groups <= 20");
  });

  test("refuses a job timeout the workflow would not wait for", () => {
    expect(at(wf(), "lifecycle", 0, "precondition", 0, "condition")).toBe(ex("local.job_wait_fits"));
    expect(readFileSync("workflows/convert.yaml", "utf8")).toContain("604800");
    expect(String(mod.locals.job_wait_fits)).toContain("<= 604800");
  });

  test("runs as the workflow service account", () => {
    expect(wf().service_account).toBe(ex("google_service_account.workflow.id"));
  });
});

describe("Cloud Run jobs", () => {
  /** The jobs are the instances of google_cloud_run_v2_job.phase, one per phase (for_each = local.jobs). */
  const PHASES = ["plan", "convert-group", "finalize"] as const;
  const job = (phase: string) => instance(mod, "google_cloud_run_v2_job", "phase", phase);
  const container = (phase: string) => at(job(phase), "template", 0, "template", 0, "containers", 0);

  // The node flag the image's ENTRYPOINT carries too (which `command` replaces; test/deploy/packaging.test.ts).
  test("plan, convert-group and finalize run `node --max-semi-space-size=1 --initial-old-space-size=64 dist/jobs/main.js <phase>` from the same image", () => {
    expect(Object.keys(mod.resource.google_cloud_run_v2_job ?? {})).toEqual(["phase"]);
    expect(resource(mod, "google_cloud_run_v2_job", "phase").for_each).toBe(ex("local.jobs"));
    expect(Object.keys(mod.locals.conversion_jobs as Obj).sort()).toEqual([...PHASES].sort());
    // With hf_export, one more: the export job, keyed by the phase it runs most (the others are args overrides).
    expect(mod.locals.jobs).toBe(ex("merge(local.conversion_jobs, { for k, v in local.export_job : k => v if local.export_on })"));
    expect(Object.keys(mod.locals.export_job as Obj)).toEqual(["export-shards"]);
    for (const phase of PHASES) {
      expect(at(container(phase), "image"), phase).toBe(ex("local.image"));
      expect(at(container(phase), "command"), phase).toEqual(["node", "--max-semi-space-size=1", "--initial-old-space-size=64"]);
      expect(at(container(phase), "args"), phase).toEqual(["dist/jobs/main.js", phase]);
    }
  });

  test("the jobs are named <name_prefix>-plan, <name_prefix>-convert-group and <name_prefix>-finalize", () => {
    expect(job("plan").name).toBe(ex("local.names.plan_job"));
    expect(job("convert-group").name).toBe(ex("local.names.group_job"));
    expect(job("finalize").name).toBe(ex("local.names.finalize_job"));
    expect(at(mod.locals.names, "plan_job")).toBe(`${ex("var.name_prefix")}-plan`);
    expect(at(mod.locals.names, "group_job")).toBe(`${ex("var.name_prefix")}-convert-group`);
    expect(at(mod.locals.names, "finalize_job")).toBe(`${ex("var.name_prefix")}-finalize`);
  });

  test("moved blocks keep the jobs of a deployment made when they were three resources", () => {
    expect(mod.moved.filter((m) => String(m.to).startsWith(ex("google_cloud_run_v2_job.").slice(0, -1)))).toEqual([
      { from: ex("google_cloud_run_v2_job.plan"), to: ex('google_cloud_run_v2_job.phase["plan"]') },
      { from: ex("google_cloud_run_v2_job.convert_group"), to: ex('google_cloud_run_v2_job.phase["convert-group"]') },
      { from: ex("google_cloud_run_v2_job.finalize"), to: ex('google_cloud_run_v2_job.phase["finalize"]') },
    ]);
    expect(readFileSync(`${MODULE}/jobs.tf`, "utf8")).toContain(
      "# https://developer.hashicorp.com/terraform/language/modules/develop/refactoring",
    );
  });

  test("each job refuses a CPU/memory pair Cloud Run does not run, naming its variables", () => {
    for (const [phase, prefix] of [
      ["plan", "plan"],
      ["convert-group", "group"],
      ["finalize", "finalize"],
    ] as const) {
      expect(at(job(phase), "lifecycle", 0, "precondition", 0), phase).toEqual({
        condition: ex(`local.job_shape_ok["${phase}"]`),
        error_message:
          `${phase} job: ${prefix}_cpu = ${ex(`var.${prefix}_cpu`)} with ${prefix}_memory = ${ex(`var.${prefix}_memory`)} do not fit ` +
          "Cloud Run jobs (1 vCPU takes 512Mi-4Gi, 2 vCPU 512Mi-8Gi, 4 vCPU 2Gi-16Gi, 6 vCPU 4Gi-24Gi, 8 vCPU 4Gi-32Gi).",
      });
    }
  });

  test("the jobs run the image the module built, orbax2reg:<identity of its sources>, or the pinned image given", () => {
    expect(mod.locals.image).toBe(ex("var.image != null ? var.image : local.built_image"));
    expect(mod.locals.built_image).toBe(
      `${ex("var.region")}-docker.pkg.dev/${ex("var.project_id")}/${ex('google_artifact_registry_repository.docker["images"].repository_id')}/` +
        `${ex("local.names.image_package")}:${ex("local.image_tag")}`,
    );
    expect(mod.locals.image_tag).toBe(ex("substr(local.image_source_id, 0, 16)"));
    expect(at(mod.locals.names, "image_package")).toBe("orbax2reg");
    expect(instance(mod, "google_artifact_registry_repository", "docker", "images").format).toBe("DOCKER");
    expect(mod.variable.image?.default).toBeNull();
    expect(mod.variable.image_tag).toBeUndefined();
  });

  test("the jobs wait for the image's build", () => {
    expect((resource(mod, "google_cloud_run_v2_job", "phase").depends_on as string[]).map(bare)).toEqual([
      "google_project_service.required",
      "terraform_data.image_build",
    ]);
  });

  test("the image is built by Cloud Build (gcloud, no shell) from the module's archive, again exactly when its identity changes", () => {
    const b = resource(mod, "terraform_data", "image_build");
    expect(b.count).toBe(ex("var.image == null ? 1 : 0"));
    expect(b.triggers_replace).toBe(ex("local.built_image"));
    const exec = at(b, "provisioner", "local-exec", 0) as Obj;
    expect(exec.command).toBe(ex("data.archive_file.image_source[0].output_path"));
    const interpreter = bare(exec.interpreter);
    for (const arg of [
      '"gcloud", "builds", "submit"',
      `"--project=${ex("var.project_id")}"`,
      `"--region=${ex("local.image_build_region")}"`,
      `"--config=${ex("path.module")}/image-build.cloudbuild.yaml"`,
      `"--substitutions=${ex("local.image_build_substitutions")}"`,
      `"--service-account=${ex("local.image_build_service_account")}"`,
      `"--gcs-source-staging-dir=gs://${ex("google_storage_bucket.sources.name")}/${ex("local.image_build_staging_prefix")}"`,
      '"--suppress-logs"',
      `["--worker-pool=${ex("var.image_build_worker_pool")}"]`,
    ])
      expect(interpreter, arg).toContain(arg);
    expect(existsSync(`${MODULE}/image-build.cloudbuild.yaml`)).toBe(true);
    const archive = mod.data.archive_file?.image_source as Obj;
    expect(archive.count).toBe(ex("var.image == null ? 1 : 0"));
    expect(at(archive, "dynamic", "source", 0, "for_each")).toBe(ex("local.image_source_files"));
    // The identity covers the base image too: a new base is a new image.
    expect(String(mod.locals.image_source_id)).toContain("var.image_build_node_image");
  });

  test("each job's CPU and memory come from its own variables", () => {
    expect(at(container("convert-group"), "resources", 0, "limits")).toEqual({ cpu: ex("var.group_cpu"), memory: ex("var.group_memory") });
    for (const phase of ["plan", "finalize"]) {
      expect(at(container(phase), "resources", 0, "limits")).toEqual({ cpu: ex(`var.${phase}_cpu`), memory: ex(`var.${phase}_memory`) });
    }
  });

  test("task timeout and retries come from variables; the tasks run as the jobs' account", () => {
    for (const name of PHASES) {
      const t = at(job(name), "template", 0, "template", 0);
      expect(at(t, "timeout"), name).toBe(ex("var.task_timeout"));
      expect(at(t, "max_retries"), name).toBe(ex("var.max_retries"));
      expect(at(t, "service_account"), name).toBe(ex("google_service_account.jobs.email"));
    }
  });

  test("each job's environment is its entry of local.job_env: job_env under the module's own variables", () => {
    for (const phase of PHASES) {
      const env = at(container(phase), "dynamic", "env", 0);
      expect(at(env, "for_each"), phase).toBe(ex(`local.job_env["${phase}"]`));
      expect(at(env, "content", 0), phase).toEqual({ name: ex("env.key"), value: ex("env.value") });
    }
    expect(mod.locals.job_env).toEqual({
      plan: ex("merge(var.job_env, local.job_location_env)"),
      "convert-group": ex("merge(var.job_env, local.job_location_env)"),
      finalize: ex("merge(var.job_env, local.job_location_env, local.finalize_env)"),
      "export-shards": ex("merge(var.job_env, local.job_location_env, local.export_env)"),
    });
  });

  test("every job gets ORBAX2REG_PROJECT and ORBAX2REG_REGION", () => {
    expect(mod.locals.job_location_env).toEqual({ ORBAX2REG_PROJECT: ex("var.project_id"), ORBAX2REG_REGION: ex("var.region") });
  });

  test("finalize gets the events topic and the retention variables that are set", () => {
    const finalize = bare(mod.locals.finalize_env);
    expect(finalize).toContain("ORBAX2REG_EVENTS_TOPIC = google_pubsub_topic.events.id");
    expect(finalize).toMatch(/ORBAX2REG_KEEP_LAST_N\s+= var\.keep_last_n/);
    expect(finalize).toMatch(/ORBAX2REG_KEEP_EVERY_N_STEPS = var\.keep_every_n_steps/);
    expect(finalize).toContain("if value != null");
  });

  test("retention is off by default: keep_last_n and keep_every_n_steps default to null", () => {
    for (const name of ["keep_last_n", "keep_every_n_steps"]) {
      const v = mod.variable[name];
      expect(v?.type, name).toBe(ex("number"));
      expect(v && "default" in v && v.default === null, name).toBe(true);
      expect(String(v?.description), name).toContain("axlearn/common/checkpointer.py");
    }
  });

  test("deletion_protection follows the deletion_protection variable (default true) on the jobs and the workflow", () => {
    expect(mod.variable.deletion_protection?.default).toBe(true);
    for (const name of PHASES) {
      expect(job(name).deletion_protection, name).toBe(ex("var.deletion_protection"));
    }
    expect(resource(mod, "google_workflows_workflow", "convert").deletion_protection).toBe(ex("var.deletion_protection"));
  });
});

describe("Pub/Sub", () => {
  test("the events topic is named by events_topic_name", () => {
    expect(resource(mod, "google_pubsub_topic", "events").name).toBe(ex("var.events_topic_name"));
  });
});

describe("IAM", () => {
  /** Condition expressions, as hcl2json renders them. */
  const CLAIMS_ONLY =
    `resource.name.startsWith("projects/_/buckets/${ex("local.destination_bucket")}/objects/") && ` +
    `resource.name.endsWith("/${CLAIM_KEY}")`;
  const IMAGE_BUILD_CONTEXTS_ONLY =
    `resource.name.startsWith("projects/_/buckets/${ex("google_storage_bucket.sources.name")}/objects/` +
    `${ex("local.image_build_staging_prefix")}/")`;
  const FUNCTION_SOURCE_ONLY =
    `resource.name.startsWith("projects/_/buckets/gcf-v2-sources-${ex("data.google_project.this.number")}-${ex("var.region")}` +
    `/objects/${ex("local.names.function")}/")`;

  /**
   * principal -> "role @ scope" (plus " if <condition>" for a conditional grant) for every binding the module makes:
   * the documented least-privilege set (terraform/README.md, "Roles").
   */
  const EXPECTED: Record<string, string[]> = {
    "gcs-agent": ["roles/pubsub.publisher @ project"],
    "pubsub-agent": ["roles/iam.serviceAccountTokenCreator @ project"],
    trigger: ["roles/eventarc.eventReceiver @ project", "roles/run.invoker @ service google_cloudfunctions2_function.on_checkpoint"],
    function: [
      "roles/pubsub.publisher @ topic google_pubsub_topic.events",
      `roles/storage.objectUser @ bucket local.destination_bucket if ${CLAIMS_ONLY}`,
      "roles/storage.objectViewer @ bucket var.checkpoint_bucket",
      "roles/workflows.invoker @ project",
    ],
    workflow: [
      "roles/logging.logWriter @ project",
      "roles/pubsub.publisher @ topic google_pubsub_topic.events",
      'roles/run.jobsExecutorWithOverrides @ job google_cloud_run_v2_job.phase["convert-group"]',
      // With hf_export: the export job (the grant's for_each is every instance of the job resource).
      'roles/run.jobsExecutorWithOverrides @ job google_cloud_run_v2_job.phase["export-shards"]',
      'roles/run.jobsExecutorWithOverrides @ job google_cloud_run_v2_job.phase["finalize"]',
      'roles/run.jobsExecutorWithOverrides @ job google_cloud_run_v2_job.phase["plan"]',
      "roles/run.viewer @ project",
      "roles/storage.objectViewer @ bucket local.destination_bucket",
    ],
    jobs: [
      "roles/pubsub.publisher @ topic google_pubsub_topic.events",
      // Writes only where main.tf's jobs_write_condition allows: test/terraform/jobs-access.test.ts evaluates it.
      `roles/storage.objectUser @ bucket local.destination_bucket if ${ex("local.jobs_write_condition")}`,
      // With hf_export: the exports' folders only (main.tf's export_write_condition).
      `roles/storage.objectUser @ bucket local.export_bucket if ${ex("local.export_write_condition")}`,
      "roles/storage.objectViewer @ bucket local.destination_bucket",
      "roles/storage.objectViewer @ bucket var.checkpoint_bucket",
    ],
    image_build: [
      'roles/artifactregistry.writer @ repository google_artifact_registry_repository.docker["images"]',
      "roles/logging.logWriter @ project",
      `roles/storage.objectViewer @ bucket google_storage_bucket.sources if ${IMAGE_BUILD_CONTEXTS_ONLY}`,
    ],
    build: [
      'roles/artifactregistry.writer @ repository google_artifact_registry_repository.docker["function_builds"]',
      "roles/logging.logWriter @ project",
      // Storage Object Admin, as https://cloud.google.com/run/docs/configuring/services/build-service-account lists it
      `roles/storage.objectAdmin @ project if ${FUNCTION_SOURCE_ONLY}`,
    ],
  };

  const MEMBER_TYPES = [
    "google_project_iam_member",
    "google_storage_bucket_iam_member",
    "google_pubsub_topic_iam_member",
    "google_cloud_run_v2_job_iam_member",
    "google_cloud_run_v2_service_iam_member",
    "google_service_account_iam_member",
    "google_artifact_registry_repository_iam_member",
  ];

  const resourceOf = (expr: unknown) => bare(expr).replace(/\.(name|id|email|service_config\[0\]\.service)$/, "");

  function principal(member: unknown): string {
    const m = /^serviceAccount:\$\{google_service_account\.(\w+)(\[0\])?\.email\}$/.exec(String(member));
    if (m?.[1]) return m[1];
    if (member === `serviceAccount:${ex("data.google_storage_project_service_account.gcs.email_address")}`) return "gcs-agent";
    if (member === `serviceAccount:service-${ex("data.google_project.this.number")}@gcp-sa-pubsub.iam.gserviceaccount.com`)
      return "pubsub-agent";
    throw new Error(`unexpected IAM member ${String(member)}`);
  }

  /** The scopes a binding covers; a for_each binding covers every resource its map names. */
  function scopes(type: string, b: Obj): string[] {
    // A for_each over the job resource's instances covers every job local.jobs can hold.
    const jobInstances = () =>
      ["conversion_jobs", "export_job"]
        .flatMap((m) => Object.keys(at(mod.locals, m) as Obj))
        .map((k) => `google_cloud_run_v2_job.phase["${k}"]`);
    const target = (expr: unknown): string[] =>
      bare(expr) === "each.value" && isObj(b.for_each)
        ? Object.values(b.for_each).map(resourceOf)
        : bare(expr) === "each.value" && /^\{\s*for \w+, \w+ in google_cloud_run_v2_job\.phase :/.test(bare(b.for_each))
          ? jobInstances()
          : [resourceOf(expr)];
    switch (type) {
      case "google_project_iam_member":
        expect(b.project).toBe(ex("var.project_id"));
        return ["project"];
      case "google_storage_bucket_iam_member":
        return target(b.bucket).map((t) => `bucket ${t}`);
      case "google_pubsub_topic_iam_member":
        return target(b.topic).map((t) => `topic ${t}`);
      case "google_cloud_run_v2_job_iam_member":
        return target(b.name).map((t) => `job ${t}`);
      case "google_cloud_run_v2_service_iam_member":
        return target(b.name).map((t) => `service ${t}`);
      case "google_service_account_iam_member":
        return target(b.service_account_id).map((t) => `serviceAccount ${t}`);
      case "google_artifact_registry_repository_iam_member":
        expect(b.location).toBe(ex("var.region"));
        return target(b.repository).map((t) => `repository ${t}`);
      default:
        throw new Error(type);
    }
  }

  function condition(b: Obj): string {
    const c = at(b, "condition", 0);
    if (c === undefined) return "";
    expect(String(at(c, "title")).length).toBeGreaterThan(5);
    return ` if ${String(at(c, "expression"))}`;
  }

  function granted(): Record<string, string[]> {
    const out: Record<string, string[]> = {};
    for (const type of MEMBER_TYPES) {
      for (const b of Object.values(mod.resource[type] ?? {})) {
        const who = principal(b.member);
        out[who] ??= [];
        for (const s of scopes(type, b)) out[who].push(`${String(b.role)} @ ${s}${condition(b)}`);
      }
    }
    for (const list of Object.values(out)) list.sort();
    return out;
  }

  /** The address of every IAM binding with its block, e.g. "google_project_iam_member.build_log_writer". */
  const bindings = () =>
    MEMBER_TYPES.flatMap((type) => Object.entries(mod.resource[type] ?? {}).map(([name, b]) => [`${type}.${name}`, b] as const));

  test("IAM is additive only (no authoritative *_iam_binding / *_iam_policy) and uses known binding types", () => {
    const iamTypes = Object.keys(mod.resource).filter((t) => /_iam_(member|binding|policy)$/.test(t));
    expect(iamTypes.filter((t) => !t.endsWith("_iam_member"))).toEqual([]);
    expect(iamTypes.filter((t) => !MEMBER_TYPES.includes(t))).toEqual([]);
  });

  test("the module creates the six dedicated service accounts, the build ones only when none is given", () => {
    expect(Object.keys(mod.resource.google_service_account ?? {}).sort()).toEqual([
      "build",
      "function",
      "image_build",
      "jobs",
      "trigger",
      "workflow",
    ]);
    expect(resource(mod, "google_service_account", "build").count).toBe(ex("var.function_build_service_account == null ? 1 : 0"));
    expect(at(mod.locals.names, "build_sa")).toBe(`${ex("var.name_prefix")}-build`);
    expect(resource(mod, "google_service_account", "image_build").count).toBe(ex("local.image_build_account_created ? 1 : 0"));
    expect(mod.locals.image_build_account_created).toBe(ex("var.image == null && var.image_build_service_account == null"));
    expect(at(mod.locals.names, "image_build_sa")).toBe(`${ex("var.name_prefix")}-imgbuild`);
  });

  for (const [who, roles] of Object.entries(EXPECTED)) {
    test(`${who}: roles are exactly ${[...new Set(roles.map((r) => r.split(" @ ")[0]))].join(", ")}`, () => {
      expect(granted()[who] ?? []).toEqual([...roles].sort());
    });
  }

  test("no principal other than the documented ones is granted anything", () => {
    expect(Object.keys(granted()).sort()).toEqual(Object.keys(EXPECTED).sort());
  });

  test("the workflow can neither update the jobs (no run.developer) nor act as their service account", () => {
    const roles = Object.values(granted()).flat();
    expect(roles.filter((r) => r.startsWith("roles/run.developer") || r.startsWith("roles/run.admin"))).toEqual([]);
    expect(roles.filter((r) => r.startsWith("roles/iam.serviceAccountUser"))).toEqual([]);
    expect(mod.resource.google_service_account_iam_member ?? {}).toEqual({});
  });

  test("the build accounts' grants exist only when the module creates them; the Pub/Sub agent's only on request", () => {
    const conditional = bindings().filter(([, b]) => "count" in b);
    expect(Object.fromEntries(conditional.map(([address, b]) => [address, b.count]))).toEqual({
      "google_project_iam_member.build_log_writer": ex("var.function_build_service_account == null ? 1 : 0"),
      "google_project_iam_member.build_reads_function_source": ex("var.function_build_service_account == null ? 1 : 0"),
      "google_project_iam_member.pubsub_agent_token_creator": ex("var.pubsub_agent_token_creator ? 1 : 0"),
      "google_storage_bucket_iam_member.jobs_destination_object_viewer": ex("local.destination_apart ? 1 : 0"),
      "google_storage_bucket_iam_member.jobs_export_object_user": ex("local.export_on ? 1 : 0"),
      "google_artifact_registry_repository_iam_member.build_writes_function_images": ex(
        "var.function_build_service_account == null ? 1 : 0",
      ),
      "google_project_iam_member.image_build_log_writer": ex("local.image_build_account_created ? 1 : 0"),
      "google_artifact_registry_repository_iam_member.image_build_pushes_images": ex("local.image_build_account_created ? 1 : 0"),
      "google_storage_bucket_iam_member.image_build_reads_sources": ex("local.image_build_account_created ? 1 : 0"),
    });
    const v = mod.variable.pubsub_agent_token_creator;
    expect(v?.default).toBe(false);
    expect(v?.type).toBe(ex("bool"));
  });

  test("every data source that needs an API waits for terraform_data.apis_enabled, which alone waits for the APIs", () => {
    const gate = resource(mod, "terraform_data", "apis_enabled");
    expect(gate.depends_on).toEqual([ex("google_project_service.required")]);
    // Nothing in it can change: created once, it never has a change planned again.
    expect(Object.keys(gate).sort()).toEqual(["depends_on"]);
    const reads = Object.entries(mod.data)
      .filter(([type]) => type.startsWith("google_"))
      .flatMap(([type, byName]) => Object.entries(byName as Record<string, Obj>).map(([name, d]) => [`${type}.${name}`, d.depends_on]));
    expect(reads.length).toBe(4);
    for (const [address, dependsOn] of reads) expect(dependsOn, String(address)).toEqual([ex("terraform_data.apis_enabled")]);
  });

  test("the claim grant checks uniform bucket-level access on the destination first", () => {
    const claims = resource(mod, "google_storage_bucket_iam_member", "function_destination_claims");
    expect(at(claims, "lifecycle", 0, "precondition", 0, "condition")).toBe(
      ex("data.google_storage_bucket.destination.uniform_bucket_level_access"),
    );
    const dest = mod.data.google_storage_bucket?.destination;
    expect(dest?.name).toBe(ex("local.destination_bucket"));
    // Read after the APIs are enabled, so a first plan needs no API call (and the offline plan test works); through
    // terraform_data.apis_enabled, so a later plan reads it at once (apis.tf says why).
    expect(dest?.depends_on).toEqual([ex("terraform_data.apis_enabled")]);
    expect(String(mod.variable.destination_bucket?.description)).toContain("uniform bucket-level access");
  });

  test("the jobs' write grant is refused where no condition can keep it off the sources, and checks uniform bucket-level access", () => {
    const grant = resource(mod, "google_storage_bucket_iam_member", "jobs_destination_object_user");
    const conditions = (at(grant, "lifecycle", 0, "precondition") as Obj[]).map((p) => p.condition);
    expect(conditions).toEqual([
      ex("local.destination_matches_template"),
      ex('local.jobs_write_form != "none"'),
      ex("data.google_storage_bucket.destination.uniform_bucket_level_access"),
    ]);
  });

  test("every grant in iam.tf cites the Google documentation it rests on", () => {
    const text = readFileSync(`${MODULE}/iam.tf`, "utf8");
    const blocks = [...text.matchAll(/((?:^#.*\n)*)resource "(\w+_iam_member)" "(\w+)"/gm)];
    expect(blocks.length).toBe(bindings().length);
    for (const [, comment, type, name] of blocks) expect(comment, `${type}.${name}`).toMatch(/# https:\/\/cloud\.google\.com\/\S+/);
  });

  test("no roles/owner or roles/editor anywhere", () => {
    for (const f of tfFiles(TERRAFORM)) expect(readFileSync(f, "utf8"), f).not.toMatch(/roles\/(owner|editor)\b/);
  });

  test("every component runs as its own service account (never the default compute account)", () => {
    const fn = resource(mod, "google_cloudfunctions2_function", "on_checkpoint");
    expect(at(fn, "service_config", 0, "service_account_email")).toBe(ex("google_service_account.function.email"));
    expect(at(fn, "event_trigger", 0, "service_account_email")).toBe(ex("google_service_account.trigger.email"));
    expect(at(fn, "build_config", 0, "service_account")).toBe(ex("local.build_service_account"));
    expect(String(mod.locals.image_build_service_account)).toBe(
      ex("var.image_build_service_account != null ? var.image_build_service_account : one(google_service_account.image_build[*].id)"),
    );
    expect(resource(mod, "google_workflows_workflow", "convert").service_account).toBe(ex("google_service_account.workflow.id"));
    for (const phase of ["conversion_jobs", "export_job"].flatMap((m) => Object.keys(mod.locals[m] as Obj))) {
      const job = instance(mod, "google_cloud_run_v2_job", "phase", phase);
      expect(at(job, "template", 0, "template", 0, "service_account"), phase).toBe(ex("google_service_account.jobs.email"));
    }
  });

  test("terraform/README.md explains every granted role, with its documentation", () => {
    const readme = readFileSync(`${TERRAFORM}/README.md`, "utf8");
    const roles = new Set(Object.values(EXPECTED).flatMap((list) => list.map((r) => r.split(" @ ")[0] ?? "")));
    for (const role of roles) expect(readme, role).toContain(`\`${role}\``);
    const section = readme.slice(readme.indexOf("## Roles"), readme.indexOf("## First deployment"));
    const rows = section.split("\n").filter((l) => /^\| .*`roles\//.test(l));
    expect(rows.length).toBe(Object.values(EXPECTED).flat().length - 3); // the four job grants share one row
    for (const row of rows) expect(row, row).toMatch(/https:\/\/cloud\.google\.com\//);
  });
});

describe("Failure alerts (alerts.tf)", () => {
  // The policies as google_monitoring_alert_policy.pipeline gets them: alerts.tf's table, evaluated by terraform.
  let policies: Record<string, AlertPolicy> = {};
  beforeAll(async () => {
    ({ alertPolicies: policies } = await moduleDashboard());
  }, 120_000);
  const policy = () => resource(mod, "google_monitoring_alert_policy", "pipeline");

  test("exist only when notification_channels names a channel (none by default)", () => {
    expect(mod.variable.notification_channels?.default).toEqual([]);
    expect(mod.variable.notification_channels?.nullable).toBe(false);
    expect(mod.locals.alerts).toBe(ex("length(var.notification_channels) > 0"));
    expect(bare(policy().for_each)).toMatch(/^\{ for k, p in local\.alert_policies : .* if local\.alerts \}$/);
    expect(Object.keys(policies).sort()).toEqual(["conversion_failed", "event_backlog", "event_dropped"]);
    expect(String(mod.locals.required_apis)).toContain('local.alerts || var.dashboard ? ["monitoring.googleapis.com"] : []');
  });

  test("every policy alerts the channels on any of its condition (OR), and closes 30 minutes after it last held", () => {
    const p = policy();
    expect(p.notification_channels).toBe(ex("var.notification_channels"));
    expect(p.combiner).toBe("OR");
    expect(at(p, "alert_strategy", 0, "auto_close")).toBe("1800s");
    expect(at(p, "documentation", 0, "mime_type")).toBe("text/markdown");
    expect(readFileSync(`${TERRAFORM}/README.md`, "utf8")).toContain("## Failure alerts");
    const threshold = at(p, "conditions", 0, "dynamic", "condition_threshold", 0, "content", 0) as Obj;
    expect(threshold).toMatchObject({
      comparison: "COMPARISON_GT",
      duration: "0s",
      evaluation_missing_data: "EVALUATION_MISSING_DATA_INACTIVE",
    });
  });

  test("moved blocks keep the policies of a deployment made when they were three resources", () => {
    expect(mod.moved.filter((m) => String(m.to).includes("google_monitoring_alert_policy."))).toEqual(
      ["conversion_failed", "event_dropped", "event_backlog"].map((key) => ({
        from: ex(`google_monitoring_alert_policy.${key}[0]`),
        to: ex(`google_monitoring_alert_policy.pipeline["${key}"]`),
      })),
    );
  });

  test("a failed conversion is counted by Workflows' built-in metric, not a log-based one (nothing to create first)", () => {
    // The only log-based metrics are the dashboard's (dashboard.tf), and only with var.dashboard; no alert names one.
    expect(Object.keys(mod.resource.google_logging_metric ?? {})).toEqual(["pipeline"]);
    expect(String(resource(mod, "google_logging_metric", "pipeline").for_each)).toContain("if var.dashboard");
    for (const p of Object.values(policies)) expect(p.threshold?.filter ?? p.log_match).not.toContain("logging.googleapis.com/user/");
    const filter = policies.conversion_failed?.threshold?.filter;
    for (const term of [
      'metric.type="workflows.googleapis.com/finished_execution_count"',
      'metric.labels.status="FAILED"',
      'resource.type="workflows.googleapis.com/Workflow"',
      'resource.labels.workflow_id="orbax2reg-convert"',
      'resource.labels.location="us-central1"',
    ])
      expect(filter).toContain(term);
  });

  test("the failed-executions alert says conversion or export: an export that fails fails its execution", () => {
    expect(policies.conversion_failed?.title).toBe("a conversion or export failed");
    expect(policies.conversion_failed?.documentation).toContain("Hugging Face export");
  });

  test("with hf_export: an export task's permanent ERROR line alerts as it arrives, naming the export job", async () => {
    const on = await moduleDashboard(['hf_export={steps = [1000], destination_template = "gs://regular/{root}/hf/{step}"}']);
    expect(Object.keys(on.alertPolicies).sort()).toEqual(["conversion_failed", "event_backlog", "event_dropped", "export_failed"]);
    const p = on.alertPolicies.export_failed as AlertPolicy;
    expect(p.threshold).toBeUndefined();
    expect(p.log_match).toBe(
      'resource.type="cloud_run_job" AND resource.labels.job_name="orbax2reg-export" AND jsonPayload.component="orbax2reg-job" AND ' +
        'severity>=ERROR AND jsonPayload.permanent="true"',
    );
    expect(on.alertPolicies.conversion_failed?.documentation).toContain("`orbax2reg-export`");
  }, 120_000);

  test("a failed conversion alerts on any failure in 5 minutes", () => {
    expect(policies.conversion_failed?.threshold).toMatchObject({ above: 0, period: "300s", aligner: "ALIGN_SUM" });
    expect(policies.conversion_failed?.log_match).toBeUndefined();
  });

  test("a dropped event alerts on the function's own ERROR lines, as they arrive, at most once per 5 minutes", () => {
    const p = policies.event_dropped as AlertPolicy;
    expect(p.threshold).toBeUndefined();
    for (const term of [
      'resource.type="cloud_run_revision"',
      'resource.labels.service_name="orbax2reg-on-checkpoint"',
      'jsonPayload.component="orbax2reg-trigger"',
      "severity>=ERROR",
    ])
      expect(p.log_match).toContain(term);
    // A log-match condition needs a notification rate limit: the policy has one exactly when it matches log lines.
    const log = at(policy(), "conditions", 0, "dynamic", "condition_matched_log", 0) as Obj;
    expect(log.for_each).toBe(ex("each.value.log_match[*]"));
    const limit = at(policy(), "alert_strategy", 0, "dynamic", "notification_rate_limit", 0) as Obj;
    expect(limit.for_each).toBe(ex("each.value.log_match[*]"));
    expect(at(limit, "content", 0, "period")).toBe("300s");
    // Every ERROR line the function writes for a dropped event is explained in the policy's documentation.
    for (const line of ["the workflow refused to start", "misconfigured, events are acknowledged", "still failing"])
      expect(p.documentation).toContain(line);
  });

  test("an undelivered event alerts on the age of the oldest unacknowledged message of the trigger's own subscription", () => {
    const p = policies.event_backlog as AlertPolicy;
    expect(p.threshold).toMatchObject({ above: 600, period: "60s", aligner: "ALIGN_MAX" });
    expect(at(policy(), "conditions", 0, "dynamic", "condition_threshold", 0, "content", 0, "threshold_value")).toBe(
      ex("condition_threshold.value.above"),
    );
    // The table is a merge() (the export's policy only with hf_export): its source says where the threshold comes from.
    expect(readFileSync(join(MODULE, "alerts.tf"), "utf8")).toMatch(
      /event_backlog = \{[\s\S]*?threshold = \{[^}]*above = var\.event_backlog_alert_seconds/,
    );
    for (const term of [
      'metric.type="pubsub.googleapis.com/subscription/oldest_unacked_message_age"',
      'resource.type="pubsub_subscription"',
      `resource.labels.subscription_id=starts_with("eventarc-us-central1-${TRIGGER_ID}-sub-")`,
    ])
      expect(p.threshold?.filter).toContain(term);
    // Eventarc names the subscription eventarc-REGION-TRIGGER_ID-sub-N; the trigger's id is read from the function.
    expect(mod.locals.trigger_subscription_prefix).toBe(`eventarc-${ex("local.trigger_region")}-${ex("local.trigger_id")}-sub-`);
    expect(String(mod.locals.trigger_id)).toContain("google_cloudfunctions2_function.on_checkpoint.event_trigger[0].trigger");
    // Within 15 minutes: the default threshold plus a minute's sampling and 2 minutes' delay.
    expect(mod.variable.event_backlog_alert_seconds?.default).toBe(600);
    expect(Number(mod.variable.event_backlog_alert_seconds?.default) + 60 + 120).toBeLessThanOrEqual(15 * 60);
  });

  test("the component the ERROR filter names is the function's logger's", () => {
    expect(readFileSync("functions/index.ts", "utf8")).toContain('jsonLogger({ component: "orbax2reg-trigger" })');
  });
});

describe("APIs", () => {
  test("the required APIs include workflowexecutions and cloudresourcemanager, and are never disabled on destroy", () => {
    const apis = String(mod.locals.required_apis);
    for (const api of [
      "cloudresourcemanager", // data.google_project and the project IAM bindings
      "run",
      "workflows",
      "workflowexecutions",
      "cloudfunctions",
      "cloudbuild",
      "eventarc",
      "pubsub",
      "artifactregistry",
      "storage",
      "logging",
      "iam",
      "cloudquotas", // orbax2reg cloud check reads the Cloud Run quotas
    ]) {
      expect(apis).toContain(`"${api}.googleapis.com"`);
    }
    const svc = resource(mod, "google_project_service", "required");
    expect(svc.disable_on_destroy).toBe(false);
    expect(String(svc.for_each)).toContain("local.required_apis");
  });
});

describe("versions", () => {
  for (const [label, dir] of [
    ["module", () => mod],
    ["example", () => example],
  ] as const) {
    test(`${label}: terraform >= 1.5 and hashicorp/google pinned to ~> 7.x`, () => {
      const tf = dir().terraform;
      expect(tf.map((t) => t.required_version)).toContain(">= 1.5");
      const providers = tf.flatMap((t) => (Array.isArray(t.required_providers) ? t.required_providers : [])) as Obj[];
      const google = providers.map((p) => p.google).find(isObj);
      expect(google?.source).toBe("hashicorp/google");
      expect(String(google?.version)).toMatch(/^~> 7\.\d+$/);
      if (label === "module")
        expect(providers.map((p) => p.archive).find(isObj)).toEqual({ source: "hashicorp/archive", version: "~> 2.7" });
      // Every declared provider carries a pessimistic pin.
      for (const p of providers)
        for (const [name, spec] of Object.entries(p)) expect(String(at(spec, "version")), name).toMatch(/^~> \d+\.\d+/);
    });
  }

  test("the module has no provider block (the caller configures the provider)", () => {
    for (const f of mod.files) expect(readFileSync(f, "utf8"), f).not.toMatch(/^\s*provider\s+"/m);
  });
});

describe("documentation", () => {
  for (const [label, dir] of [
    ["module", () => mod],
    ["example", () => example],
  ] as const) {
    test(`${label}: every variable has a description`, () => {
      const vars = Object.entries(dir().variable);
      expect(vars.length).toBeGreaterThan(0);
      for (const [name, v] of vars) expect(String(v.description ?? "").length, name).toBeGreaterThan(10);
    });

    test(`${label}: every output has a description`, () => {
      for (const [name, o] of Object.entries(dir().output)) expect(String(o.description ?? "").length, name).toBeGreaterThan(10);
    });
  }

  test("the module README lists every variable and output", () => {
    const readme = readFileSync(`${MODULE}/README.md`, "utf8");
    for (const name of [...Object.keys(mod.variable), ...Object.keys(mod.output)]) expect(readme, name).toContain(`| \`${name}\` |`);
  });

  test("the module and the example output the destination template and the group count (the CLI reads them)", () => {
    expect(mod.output.destination_template?.value).toBe(ex("var.destination_template"));
    expect(mod.output.groups?.value).toBe(ex("var.groups"));
    expect(example.output.destination_template?.value).toBe(ex("module.orbax2reg.destination_template"));
    expect(example.output.groups?.value).toBe(ex("module.orbax2reg.groups"));
  });

  test("the module and the example output hf_export's destination template, null when it is off (cloud check reads it)", () => {
    expect(mod.output.hf_export_destination_template?.value).toBe(ex("var.hf_export == null ? null : var.hf_export.destination_template"));
    expect(example.output.hf_export_destination_template?.value).toBe(ex("module.orbax2reg.hf_export_destination_template"));
  });

  test("the module's outputs name what it created", () => {
    expect(Object.keys(mod.output)).toEqual(
      expect.arrayContaining([
        "workflow_id",
        "plan_job_name",
        "group_job_name",
        "finalize_job_name",
        "function_name",
        "events_topic_id",
        "function_service_account_email",
        "trigger_service_account_email",
        "workflow_service_account_email",
        "jobs_service_account_email",
        "artifact_repository_url",
      ]),
    );
  });
});

describe("example root", () => {
  test("uses the module and passes every required variable", () => {
    const m = example.module.orbax2reg;
    expect(m?.source).toBe("../../modules/orbax2reg");
    expect(existsSync(join(EXAMPLE, String(m?.source), "main.tf"))).toBe(true);
    const required = Object.entries(mod.variable)
      .filter(([, v]) => !("default" in v))
      .map(([name]) => name);
    for (const name of required) expect(m, name).toHaveProperty(name);
    const known = new Set([...Object.keys(mod.variable), "source", "version", "providers", "depends_on", "count", "for_each"]);
    for (const arg of Object.keys(m ?? {})) expect(known.has(arg), `unknown module argument ${arg}`).toBe(true);
  });

  test("passes the step selection and retention variables through", () => {
    const m = example.module.orbax2reg;
    for (const name of ["convert_every_n_steps", "keep_last_n", "keep_every_n_steps"]) {
      expect(m?.[name], name).toBe(ex(`var.${name}`));
      expect(example.variable[name]?.default, name).toBe(mod.variable[name]?.default);
    }
  });

  test("writes the regular checkpoints to a bucket of its own unless told otherwise (convert_into_checkpoint_bucket)", () => {
    expect(example.variable.convert_into_checkpoint_bucket?.default).toBe(false);
    expect(example.variable.destination_bucket?.default).toBeNull();
    const bucket = resource(example, "google_storage_bucket", "regular");
    expect(bucket.count).toBe(ex("local.create_destination ? 1 : 0"));
    expect(bucket.uniform_bucket_level_access).toBe(true);
    expect(example.locals.create_destination).toBe(ex("!var.convert_into_checkpoint_bucket && var.destination_bucket == null"));
    expect(example.module.orbax2reg?.destination_template).toBe(ex("local.destination_template"));
    expect(at(bucket, "soft_delete_policy", 0, "retention_duration_seconds")).toBe(ex("var.destination_soft_delete_seconds"));
    expect(example.variable.destination_soft_delete_seconds?.default).toBe(0);
  });

  test("terraform.tfvars.example sets every example variable without a default", () => {
    const tfvars = readFileSync(`${EXAMPLE}/terraform.tfvars.example`, "utf8");
    for (const [name, v] of Object.entries(example.variable)) {
      if (!("default" in v)) expect(tfvars, name).toMatch(new RegExp(`^${name}\\s*=`, "m"));
    }
  });
});
