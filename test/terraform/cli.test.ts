// Checks with the real terraform binary (scripts/install.sh guarantees the pinned v1.11.4: the machine's own, or one
// built into .tools/bin), on every machine and offline:
// - `terraform fmt -check -recursive -diff terraform`;
// - the module's variable validations and derived checks: variables.tf + main.tf hold no resource or data source, so
//   `terraform apply` evaluates them with no provider, and the locals are read back as outputs;
// - what the module builds from (sources.tf, locals too): each archive's identity follows exactly its own files;
// - terraform/README.md's first deployment is one `terraform apply`, with nothing built on the operator's machine.
// Provider-dependent checks (init, validate, plan with hashicorp/google) are in provider.test.ts.
import { appendFileSync, copyFileSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { parse } from "@cdktf/hcl2json";
import { beforeAll, describe, expect, test } from "vitest";
import { deployedSettings } from "../e2e/deployed.js";
import { copyOfSources, type ModuleSources, moduleSources } from "../helpers/sources.js";
import { applyForOutputs, TERRAFORM_VERSION, terraform } from "../helpers/terraform.js";
import { tempDir } from "../helpers/tmp.js";

const MODULE = resolve("terraform/modules/orbax2reg");

/** The hf_export of terraform/README.md's example (its `hf_export` section's hcl block), as hcl2json reads it. */
async function readmeHfExport(): Promise<Record<string, unknown>> {
  const readme = readFileSync("terraform/README.md", "utf8");
  const hcl = /```hcl\n([\s\S]*?)```/.exec(readme.slice(readme.indexOf("### `hf_export`")))?.[1] ?? "";
  const first = (v: unknown) => (Array.isArray(v) ? v[0] : v) as Record<string, unknown>;
  const block = first(first(((await parse("README.md", hcl)) as Record<string, unknown>).module).orbax2reg);
  return first(block.hf_export);
}

test(`terraform is the pinned v${TERRAFORM_VERSION}`, () => {
  const r = terraform(["version"], process.cwd());
  expect(r.code, r.out).toBe(0);
  expect(r.stdout.split("\n")[0]).toBe(`Terraform v${TERRAFORM_VERSION}`);
});

describe("terraform fmt", () => {
  test("every .tf file under terraform/ is formatted (terraform fmt -check -recursive -diff terraform)", () => {
    const r = terraform(["fmt", "-check", "-recursive", "-diff", "terraform"], process.cwd());
    expect(r.out).toBe("");
    expect(r.code).toBe(0);
  });

  test("the check flags a misaligned file with exit 3 and shows the diff", () => {
    const dir = tempDir("tf-fmt");
    writeFileSync(join(dir, "main.tf"), 'resource "a" "b" {\n  x = 1\n  longer = 2\n}\n');
    const r = terraform(["fmt", "-check", "-recursive", "-diff", dir], process.cwd());
    expect(r.code).toBe(3);
    expect(r.out).toContain("main.tf");
    expect(r.out).toContain("+  x      = 1");
  });

  test("the check rejects invalid HCL with exit 2", () => {
    const dir = tempDir("tf-fmt");
    writeFileSync(join(dir, "main.tf"), 'resource "a" {\n');
    expect(terraform(["fmt", "-check", "-recursive", dir], process.cwd()).code).toBe(2);
  });
});

describe("module checks evaluated offline (variables.tf + main.tf)", () => {
  let dir = "";
  const REQUIRED = {
    project_id: "my-project",
    region: "us-central1",
    checkpoint_bucket: "ckpts",
    function_source_bucket: "src-bucket",
    function_source_object: "fn/orbax2reg-0123.zip",
  };
  const LOCALS = [
    "destination_bucket",
    "destination_matches_template",
    "function_shape_ok",
    "function_source_given",
    "image_build_region",
    "image_build_region_chosen",
    "job_shape_ok",
    "job_wait_fits",
    "names",
    "export_bucket_known",
    "export_write_form",
  ];

  /** Applies variables.tf + main.tf (variables and locals only) with these values; returns the locals or the error. */
  function evaluate(vars: Record<string, string | undefined>): { code: number; out: string; locals: Record<string, unknown> } {
    const args: string[] = [];
    for (const [k, v] of Object.entries({ ...REQUIRED, ...vars })) if (v !== undefined) args.push("-var", `${k}=${v}`);
    const { code, out, outputs } = applyForOutputs(dir, args);
    return { code, out, locals: outputs };
  }

  beforeAll(() => {
    dir = tempDir("tf-module");
    copyFileSync(join(MODULE, "variables.tf"), join(dir, "variables.tf"));
    copyFileSync(join(MODULE, "main.tf"), join(dir, "main.tf"));
    writeFileSync(join(dir, "probe.tf"), LOCALS.map((l) => `output "${l}" {\n  value = local.${l}\n}\n`).join("\n"));
    const init = terraform(["init", "-backend=false", "-input=false", "-no-color"], dir);
    expect(init.code, init.out).toBe(0);
  });

  test("the defaults pass every validation and fit Cloud Run (8 vCPU / 32Gi group job)", () => {
    const r = evaluate({});
    expect(r.code, r.out).toBe(0);
    expect(r.locals.job_shape_ok).toEqual({ plan: true, "convert-group": true, finalize: true });
    expect(r.locals.function_shape_ok).toBe(true);
    expect(r.locals.destination_bucket).toBe("ckpts");
    expect(r.locals.destination_matches_template).toBe(true);
  });

  // https://cloud.google.com/build/docs/locations, "Restricted regions for some projects".
  test.each([
    [{ region: "us-central1" }, "us-central1", true],
    [{ region: "europe-west1" }, "europe-west1", true],
    [{ region: "europe-west4" }, "europe-west4", false],
    [{ region: "europe-west4", image_build_region: "europe-west1" }, "europe-west1", true],
    [{ region: "europe-west4", image_build_region: "europe-west4" }, "europe-west4", true],
    [{ region: "europe-west4", image_build_worker_pool: "projects/p/locations/europe-west3/workerPools/pool" }, "europe-west3", true],
  ])("the image build's region, with %j: %s, chosen at plan time: %s", (vars, region, chosen) => {
    const r = evaluate(vars);
    expect(r.code, r.out).toBe(0);
    expect(r.locals.image_build_region).toBe(region);
    expect(r.locals.image_build_region_chosen).toBe(chosen);
  });

  test.each([
    ["npm_registry", "registry.example"],
    ["npm_registry", "https://a,b"],
    ["debian_mirror", "ftp://mirror"],
    ["image_build_region", "EU"],
    ["function_build_worker_pool", "pool"],
    ["image_versions_kept", "0"],
  ])("refuses %s = %s", (name, value) => {
    const r = evaluate({ [name]: value });
    expect(r.code).not.toBe(0);
    expect(r.out).toContain(name);
  });

  test.each([
    ["region", "US"],
    ["region", "us-central1-a"],
    ["checkpoint_bucket", "gs://ckpts"],
    ["checkpoint_bucket", "Ckpts"],
    ["max_parallel_groups", "0"],
    ["max_parallel_groups", "21"],
    ["groups", "0"],
    ["groups", "2.5"],
    ["group_cpu", "3"],
    ["group_memory", "32GB"],
    ["group_memory", "256Mi"],
    ["plan_memory", "33Gi"],
    ["finalize_memory", "511Mi"],
    ["task_timeout", "1h"],
    ["task_timeout", "604801s"],
    ["max_retries", "11"],
    ["destination_template", "gs://{bucket}/{run}/regular"],
    ["destination_template", "/local/path"],
    ["checkpoint_prefixes", '["gs://ckpts/runs"]'],
    ["checkpoint_prefixes", '["runs,exp"]'],
    ["name_prefix", "This-Is-Not-Valid"],
    ["name_prefix", "a-prefix-of-22-letters"],
    ["function_build_service_account", "orbax2reg-build@my-project.iam.gserviceaccount.com"],
    ["function_build_service_account", "projects/my-project/serviceAccounts/no-email"],
    ["function_timeout_seconds", "541"],
    ["function_cpu", "0.5"],
    ["function_cpu", "3"],
    ["function_concurrency", "0"],
    ["function_concurrency", "1001"],
    ["function_concurrency", "2.5"],
    ["function_memory", "1GB"],
    ["destination_bucket", "gs://regular"],
    ["convert_every_n_steps", "0"],
    ["convert_every_n_steps", "2.5"],
    ["keep_last_n", "-1"],
    ["keep_last_n", "1.5"],
    ["keep_every_n_steps", "-1000"],
    ["notification_channels", '["1234567890"]'],
    ["notification_channels", '["projects/my-project/alertPolicies/1"]'],
  ])("validation rejects %s = %s", (name, value) => {
    const r = evaluate({ [name]: value });
    expect(r.code, r.out).not.toBe(0);
    expect(r.out).toContain("Invalid value for variable");
    expect(r.out).toContain(`var.${name}`);
  });

  test("notification_channels takes channel names (none by default)", () => {
    expect(evaluate({}).code).toBe(0);
    const r = evaluate({ notification_channels: '["projects/my-project/notificationChannels/1234567890"]' });
    expect(r.code, r.out).toBe(0);
  });

  test("pubsub_agent_token_creator takes a bool (default false) and nothing else", () => {
    expect(evaluate({ pubsub_agent_token_creator: "true" }).code).toBe(0);
    const r = evaluate({ pubsub_agent_token_creator: "maybe" });
    expect(r.code, r.out).not.toBe(0);
    expect(r.out).toContain("Invalid value for input variable");
    expect(r.out).toContain("a bool is required");
  });

  test("a build service account given as projects/<project>/serviceAccounts/<email> is accepted", () => {
    const r = evaluate({
      function_build_service_account: "projects/my-project/serviceAccounts/builder@my-project.iam.gserviceaccount.com",
    });
    expect(r.code, r.out).toBe(0);
  });

  test("the longest name_prefix and project id still yield valid service account ids (6-30), repository ids and bucket names", () => {
    const r = evaluate({ name_prefix: "a-prefix-of-21-chars1", project_id: "a-project-id-of-thirty-chars-1" });
    expect(r.code, r.out).toBe(0);
    const names = r.locals.names as Record<string, string>;
    for (const key of ["function_sa", "trigger_sa", "workflow_sa", "jobs_sa", "build_sa", "image_build_sa"])
      expect(names[key], key).toMatch(/^[a-z][a-z0-9-]{4,28}[a-z0-9]$/);
    expect(names.build_sa).toBe("a-prefix-of-21-chars1-build");
    expect(names.image_build_sa).toBe("a-prefix-of-21-chars1-imgbuild");
    expect(names.function_repository).toMatch(/^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$/);
    // Bucket names: 3-63 lowercase letters, digits and hyphens without dots (https://cloud.google.com/storage/docs/buckets#naming).
    expect(names.sources_bucket).toBe("a-project-id-of-thirty-chars-1-a-prefix-of-21-chars1-sources");
    expect(names.sources_bucket).toMatch(/^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$/);
  });

  test("more memory than the CPU count allows is flagged (6 vCPU with 32Gi)", () => {
    const r = evaluate({ group_cpu: "6" });
    expect(r.code, r.out).toBe(0);
    expect(r.locals.job_shape_ok).toEqual({ plan: true, "convert-group": false, finalize: true });
  });

  test.each([
    ["8", "2Gi", false],
    ["8", "4Gi", true],
    ["6", "4095Mi", false],
    ["6", "4Gi", true],
    ["4", "1Gi", false],
    ["4", "2048Mi", true],
    ["2", "512Mi", true],
    ["1", "4Gi", true],
    ["1", "5Gi", false],
  ])("less memory than the CPU count needs is flagged too: %s vCPU with %s fits: %s", (cpu, memory, fits) => {
    const r = evaluate({ group_cpu: cpu, group_memory: memory });
    expect(r.code, r.out).toBe(0);
    expect(r.locals.job_shape_ok).toEqual({ plan: true, "convert-group": fits, finalize: true });
  });

  test.each([
    ["1", "512Mi", true],
    ["1", "512M", false],
    ["1", "4Gi", true],
    ["1", "5Gi", false],
    ["2", "8Gi", true],
    ["4", "1Gi", false],
    ["8", "4G", false],
    ["8", "4Gi", true],
  ])("the function's CPU and memory must be a pair Cloud Run runs: %s vCPU with %s fits: %s", (cpu, memory, fits) => {
    const r = evaluate({ function_cpu: cpu, function_memory: memory });
    expect(r.code, r.out).toBe(0);
    expect(r.locals.function_shape_ok).toBe(fits);
  });

  test("the function's source is the module's archive, or a prebuilt object (a bucket alone names nothing)", () => {
    expect(evaluate({}).locals.function_source_given).toBe(true);
    expect(evaluate({ function_source_bucket: undefined, function_source_object: undefined }).locals.function_source_given).toBe(true);
    expect(evaluate({ function_source_bucket: undefined }).locals.function_source_given).toBe(true);
    expect(evaluate({ function_source_object: undefined }).locals.function_source_given).toBe(false);
  });

  test("a task timeout the workflow would not wait for is flagged", () => {
    expect(evaluate({}).locals.job_wait_fits).toBe(true);
    expect(evaluate({ task_timeout: "604800s", max_retries: "1" }).locals.job_wait_fits).toBe(false);
  });

  test("a destination template naming another bucket than destination_bucket is flagged", () => {
    expect(evaluate({ destination_template: "gs://other/{root}" }).locals.destination_matches_template).toBe(false);
    const ok = evaluate({ destination_template: "gs://other/{root}", destination_bucket: "other" });
    expect(ok.locals.destination_bucket).toBe("other");
    expect(ok.locals.destination_matches_template).toBe(true);
  });

  test("terraform/README.md's hf_export example, with the example's own bucket for the regular checkpoints, passes every validation and is granted its exports only", async () => {
    const bucket = "my-project-orbax2reg-regular"; // examples/basic's, for project_id my-project
    const hfExport = await readmeHfExport();
    expect(hfExport.destination_template).toMatch(new RegExp(`^gs://${bucket}/`));
    // A JSON object is an HCL object constructor too.
    const r = evaluate({ destination_bucket: bucket, destination_template: `gs://${bucket}/{root}`, hf_export: JSON.stringify(hfExport) });
    expect(r.code, r.out).toBe(0);
    // iam.tf's preconditions on the exports' grant: a bucket the jobs list, and a condition naming the exports only.
    expect(r.locals.export_bucket_known).toBe(true);
    expect(r.locals.export_write_form).toBe("prefix");
  });
});

describe("step selection and retention, as the example root deploys them (test/e2e/deployed.ts)", () => {
  const TFVARS = { project_id: "my-project", checkpoint_bucket: "ckpts" };

  test("by default: every step converted, no retention variable on the finalize job, project and region on every job", async () => {
    const d = await deployedSettings(TFVARS);
    expect(d.functionEnv.ORBAX2REG_CONVERT_EVERY_N_STEPS).toBe("1");
    const location = { ORBAX2REG_PROJECT: "my-project", ORBAX2REG_REGION: "us-central1" };
    expect(d.jobEnv).toEqual({
      plan: location,
      "convert-group": location,
      finalize: { ...location, ORBAX2REG_EVENTS_TOPIC: "projects/my-project/topics/orbax2reg-events" },
    });
  });

  test("by default the regular checkpoints go to the example's own bucket; convert_into_checkpoint_bucket puts them next to the Orbax ones", async () => {
    expect((await deployedSettings(TFVARS)).functionEnv.ORBAX2REG_DESTINATION_TEMPLATE).toBe("gs://my-project-orbax2reg-regular/{root}");
    const into = await deployedSettings({ ...TFVARS, convert_into_checkpoint_bucket: true });
    expect(into.functionEnv.ORBAX2REG_DESTINATION_TEMPLATE).toBe("gs://{bucket}/{root}/regular");
    const own = await deployedSettings({ ...TFVARS, destination_bucket: "regular-ckpts" });
    expect(own.functionEnv.ORBAX2REG_DESTINATION_TEMPLATE).toBe("gs://regular-ckpts/{root}");
  });

  test("convert_every_n_steps, keep_last_n and keep_every_n_steps reach the function and the finalize job", async () => {
    const d = await deployedSettings({ ...TFVARS, convert_every_n_steps: 1000, keep_last_n: 2, keep_every_n_steps: 3000 });
    expect(d.functionEnv.ORBAX2REG_CONVERT_EVERY_N_STEPS).toBe("1000");
    expect(d.jobEnv.finalize).toMatchObject({ ORBAX2REG_KEEP_LAST_N: "2", ORBAX2REG_KEEP_EVERY_N_STEPS: "3000" });
    expect(d.jobEnv.plan).not.toHaveProperty("ORBAX2REG_KEEP_LAST_N");
  });

  test("terraform/README.md's hf_export example, in the example's module block, reaches the function and the export job", async () => {
    const d = await deployedSettings(TFVARS, { hf_export: await readmeHfExport() });
    expect(d.functionEnv).toMatchObject({
      ORBAX2REG_EXPORT_EVERY_N_STEPS: "5000",
      ORBAX2REG_EXPORT_DESTINATION_TEMPLATE: "gs://my-project-orbax2reg-regular/hf/{root}/{step}",
      ORBAX2REG_EXPORT_DTYPE: "bfloat16",
      ORBAX2REG_EXPORT_TOKENIZER: "",
      ORBAX2REG_EXPORT_MAX_SHARD_SIZE: "5GB",
      ORBAX2REG_EXPORT_TASKS: "8",
    });
    expect(d.jobEnv["export-shards"]).toMatchObject({ ORBAX2REG_EXPORT_KEEP_LAST_N: "3", ORBAX2REG_EXPORT_KEEP_EVERY_N_STEPS: "20000" });
  });

  test("a rule left null is not set at all (the job reads unset as off)", async () => {
    const d = await deployedSettings({ ...TFVARS, keep_last_n: 5 });
    expect(d.jobEnv.finalize?.ORBAX2REG_KEEP_LAST_N).toBe("5");
    expect(d.jobEnv.finalize).not.toHaveProperty("ORBAX2REG_KEEP_EVERY_N_STEPS");
  });
});

describe("what the module builds from (sources.tf), evaluated offline", () => {
  // Each archive is named by the files in it: a change to what goes in is a new name (a new function archive, a new
  // image tag, hence a redeploy), and a change to anything else is not.
  let root = "";
  let before: ModuleSources;
  const edit = (file: string, text = "\n// edited\n") => appendFileSync(join(root, file), text);

  beforeAll(() => {
    root = copyOfSources();
    before = moduleSources(root);
  }, 60_000);

  test("the identities are those of this repository's files, in any copy of them", () => {
    const here = moduleSources();
    expect(before.imageTag).toBe(here.imageTag);
    expect(before.functionObject).toBe(here.functionObject);
    expect(before.imageTag).toMatch(/^[0-9a-f]{16}$/);
  }, 60_000);

  test("a change to the code both the function and the jobs run (src/) rebuilds both", () => {
    edit("src/errors.ts");
    const after = moduleSources(root);
    expect(after.imageTag).not.toBe(before.imageTag);
    expect(after.functionObject).not.toBe(before.functionObject);
    before = after;
  }, 60_000);

  test("a change to the function's own code rebuilds the function, not the image", () => {
    edit("functions/index.ts");
    const after = moduleSources(root);
    expect(after.imageTag).toBe(before.imageTag);
    expect(after.functionObject).not.toBe(before.functionObject);
    before = after;
  }, 60_000);

  test("a change to the Dockerfile or the image's base rebuilds the image, not the function", () => {
    edit("Dockerfile", "\n# edited\n");
    const after = moduleSources(root);
    expect(after.imageTag).not.toBe(before.imageTag);
    expect(after.functionObject).toBe(before.functionObject);
    const base = moduleSources(root, { image_build_node_image: "mirror.example/node:22-bookworm-slim" });
    expect(base.imageTag).not.toBe(after.imageTag);
    expect(base.functionObject).toBe(after.functionObject);
    before = after;
  }, 60_000);

  test("a change to anything else (the documentation) rebuilds nothing", () => {
    edit("README.md", "\nedited\n");
    const after = moduleSources(root);
    expect(after).toEqual(before);
  }, 60_000);
});

describe("terraform/README.md's first deployment", () => {
  const readme = readFileSync("terraform/README.md", "utf8");
  const start = readme.indexOf("## First deployment");
  const section = readme.slice(start, readme.indexOf("\n## ", start + 1));
  // The deployment's own commands: everything before the check, which runs the CLI wherever it is installed.
  const deploy = section.slice(0, section.indexOf("### Check the deployment"));
  const commands = [...deploy.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1] ?? "").join("\n");

  test("is one terraform apply: no -target, no docker, no npm, no node on the operator's machine", () => {
    expect(commands).toContain("terraform init");
    expect(commands).toContain("terraform apply");
    for (const command of commands.split("\n").map((l) => l.replace(/#.*$/, "").trim())) {
      expect(command, command).not.toMatch(/-target|^docker\b|^npm\b|^npx\b|^node\b/);
    }
  });

  test("says what to install and how to log in, and where the checks run", () => {
    for (const text of ["gcloud auth application-default login", "uniform-bucket-level-access", "orbax2reg cloud check", "git clone"])
      expect(section, text).toContain(text);
  });

  test("docs/operations.md links to it instead of repeating it", () => {
    const operations = readFileSync("docs/operations.md", "utf8");
    expect(operations).toContain("../terraform/README.md#first-deployment");
    expect(operations).not.toMatch(/terraform apply -target|docker build|npm run package:function/);
  });
});
