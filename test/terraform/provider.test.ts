// terraform init / validate / plan with the real hashicorp/google and hashicorp/archive providers, when a filesystem
// mirror has them ($ORBAX2REG_TF_PROVIDER_MIRROR, else ~/.terraform.d/plugins, unpacked layout
// registry.terraform.io/hashicorp/<name>/<version>/linux_amd64/terraform-provider-<name>_v<version>). No registry
// serves them here, so they are built from their source tags (tools/README.md, "Terraform"); without them these tests
// skip.
//
// Everything runs in a temporary copy of the repository's terraform/, workflows/ and the sources the module archives
// (it reads them from path.module/../../..), so no .terraform/ or .terraform.lock.hcl lands in the repository: a lock
// file made from a local build carries hashes no real registry download would match.
import { spawnSync } from "node:child_process";
import { cpSync, existsSync, readFileSync } from "node:fs";
import { basename, join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { PYTHON } from "../helpers/paths.js";
import { MODULE_REPOSITORY_FILES, moduleSources } from "../helpers/sources.js";
import {
  ARCHIVE_PROVIDER_VERSION,
  GOOGLE_PROVIDER_VERSION,
  mirrorCliConfig,
  type PlannedChange,
  planAndShow,
  providerMirror,
  terraformAsync,
} from "../helpers/terraform.js";
import { tempDir } from "../helpers/tmp.js";

const { mirror, missing, present } = providerMirror();
const WHY_SKIPPED = `skipped: no ${missing.join(", ")} (build hashicorp/google v${GOOGLE_PROVIDER_VERSION} and hashicorp/archive v${ARCHIVE_PROVIDER_VERSION} per tools/README.md, or set ORBAX2REG_TF_PROVIDER_MIRROR)`;
if (!present) console.warn(`test/terraform/provider.test.ts ${WHY_SKIPPED}`);

/** What the module reads besides terraform/: the workflow and the sources it archives (sources.tf). */
const REPOSITORY_FILES = MODULE_REPOSITORY_FILES;

/** Values for the module's required variables; trigger_region given so no bucket is read at plan time. */
const ROOT_VARS = {
  project_id: "my-project",
  region: "us-central1",
  checkpoint_bucket: "ckpts",
  trigger_region: "us-central1",
};

/** The image a planned Cloud Run job's container runs. */
const jobImage = (job: Record<string, unknown> | null | undefined): string | undefined =>
  (job?.template as { template: { containers: { image: string }[] }[] }[] | undefined)?.[0]?.template[0]?.containers[0]?.image;

/** The entries of a zip, in order (Python's zipfile: the test venv's interpreter). */
function zipEntries(zip: string): string[] {
  const r = spawnSync(PYTHON, ["-c", "import sys, zipfile; print('\\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))", zip], {
    encoding: "utf8",
  });
  if (r.status !== 0) throw new Error(r.stderr);
  return r.stdout.trim().split("\n");
}

// A plan of the whole module takes 30-45 s on 2 cores (the archives' contents are evaluated in it) and some tests make
// two: each test gets 4 minutes, so a slow machine fails none for time (a timed-out plan would also keep terraform's
// state lock from the tests after it).
describe.skipIf(!present)(
  `terraform init/validate/plan with hashicorp/google v${GOOGLE_PROVIDER_VERSION} and hashicorp/archive v${ARCHIVE_PROVIDER_VERSION} from a filesystem mirror${present ? "" : ` (${WHY_SKIPPED})`}`,
  { timeout: 240_000 },
  () => {
    let root = "";
    let cliConfig = "";
    const MODULE = () => join(root, "terraform/modules/orbax2reg");
    const EXAMPLE = () => join(root, "terraform/examples/basic");
    /** No real credentials: the provider is configured with a dummy token and must not need to call any API. */
    const env = {
      GOOGLE_OAUTH_ACCESS_TOKEN: "dummy",
      GOOGLE_CREDENTIALS: undefined,
      GOOGLE_APPLICATION_CREDENTIALS: undefined,
      GOOGLE_IMPERSONATE_SERVICE_ACCOUNT: undefined,
    };
    const tf = (args: string[], cwd: string) => terraformAsync(args, cwd, { cliConfig, env, timeoutMs: 300_000 });

    /**
     * `terraform plan` of a root configuration (the module itself by default) on an empty state: the summary line, the
     * planned resources and the configuration as `terraform show -json` gives them; a failed plan, its code and output.
     */
    const tryPlan = (vars: Record<string, string>, dir = MODULE(), base: Record<string, string> = ROOT_VARS) =>
      planAndShow(
        (args) => tf(args, dir),
        ["-refresh=false", "-input=false", "-no-color", ...Object.entries({ ...base, ...vars }).flatMap(([k, v]) => ["-var", `${k}=${v}`])],
      );

    /** tryPlan, which must succeed. */
    async function plan(vars: Record<string, string>, dir = MODULE(), base: Record<string, string> = ROOT_VARS) {
      const planned = await tryPlan(vars, dir, base);
      expect(planned.code, planned.out).toBe(0);
      return planned;
    }

    const after = (changes: PlannedChange[], address: string): Record<string, unknown> => {
      const c = changes.find((x) => x.address === address);
      if (!c?.change.after) throw new Error(`${address} is not in the plan`);
      return c.change.after;
    };

    beforeAll(async () => {
      root = tempDir("tf-provider");
      const skip = (src: string) => ![".terraform", ".terraform.lock.hcl", "terraform.tfstate", "terraform.tfvars"].includes(basename(src));
      cpSync("terraform", join(root, "terraform"), { recursive: true, filter: skip });
      for (const entry of REPOSITORY_FILES) cpSync(entry, join(root, entry), { recursive: true });
      cliConfig = mirrorCliConfig(mirror);
    });

    for (const [label, dir] of [
      ["module", MODULE],
      ["example", EXAMPLE],
    ] as const) {
      test(`${label}: terraform init -backend=false installs the providers from the mirror, and terraform validate passes`, async () => {
        const init = await tf(["init", "-backend=false", "-input=false", "-no-color"], dir());
        expect(init.code, init.out).toBe(0);
        expect(init.out).toContain(`Installing hashicorp/google v${GOOGLE_PROVIDER_VERSION}...`);
        expect(init.out).toContain(`Installing hashicorp/archive v${ARCHIVE_PROVIDER_VERSION}...`);
        expect(init.out).toContain("Terraform has been successfully initialized!");
        const validate = await tf(["validate", "-no-color"], dir());
        expect(validate.code, validate.out).toBe(0);
        expect(validate.stdout.trim()).toBe("Success! The configuration is valid.");
      });
    }

    describe("plan of the module as root, offline (GOOGLE_OAUTH_ACCESS_TOKEN=dummy, -refresh=false)", () => {
      let changes: PlannedChange[] = [];
      let summary = "";

      beforeAll(async () => {
        const init = await tf(["init", "-backend=false", "-input=false", "-no-color"], MODULE());
        expect(init.code, init.out).toBe(0);
        ({ changes, summary } = await plan({}));
      });

      test("creates everything and nothing else", async () => {
        // 13 APIs, the gate the data sources wait for (apis.tf), function, workflow, 3 jobs, topic, 2 repositories, 6
        // service accounts, the sources bucket, the function's archive in it and the image's build = 31 resources, and
        // 23 grants: GCS agent 1, trigger 2,
        // function 4, workflow 7 (3 jobs), jobs 3, build 3, image build 3.
        expect(summary).toBe("Plan: 54 to add, 0 to change, 0 to destroy.");
        expect(changes.every((c) => c.change.actions.join() === "create" || c.change.actions.join() === "read")).toBe(true);
      });

      test("the data sources that need an API wait for apply (the plan makes no call)", async () => {
        const reads = changes.filter((c) => c.change.actions.join() === "read").map((c) => c.address);
        expect(reads.sort()).toEqual([
          "data.google_project.this",
          "data.google_storage_bucket.destination",
          "data.google_storage_project_service_account.gcs",
        ]);
        // The archives are made at plan time, on this machine, without any call.
      });

      test("the planned grants are the least-privilege set: roles, members, scopes and conditions", async () => {
        const grants = Object.fromEntries(
          changes
            .filter((c) => c.type.endsWith("_iam_member") && c.change.after)
            .map((c) => {
              const a = c.change.after as Record<string, unknown>;
              const known = (a.condition as { expression?: string }[] | undefined)?.[0]?.expression;
              const unknown = (c.change.after_unknown?.condition as { expression?: boolean }[] | undefined)?.[0]?.expression;
              const cond = known ?? (unknown ? "(known after apply)" : undefined);
              return [c.address, `${String(a.role)}${cond === undefined ? "" : ` if ${cond}`}`];
            }),
        );
        expect(grants).toEqual({
          "google_project_iam_member.gcs_agent_pubsub_publisher": "roles/pubsub.publisher",
          "google_project_iam_member.trigger_event_receiver": "roles/eventarc.eventReceiver",
          "google_cloud_run_v2_service_iam_member.trigger_invokes_function": "roles/run.invoker",
          "google_project_iam_member.function_workflows_invoker": "roles/workflows.invoker",
          "google_pubsub_topic_iam_member.function_events_publisher": "roles/pubsub.publisher",
          "google_storage_bucket_iam_member.function_checkpoint_object_viewer": "roles/storage.objectViewer",
          "google_storage_bucket_iam_member.function_destination_claims":
            'roles/storage.objectUser if resource.name.startsWith("projects/_/buckets/ckpts/objects/") && resource.name.endsWith("/.orbax2reg/claim.json")',
          'google_cloud_run_v2_job_iam_member.workflow_runs_jobs["plan"]': "roles/run.jobsExecutorWithOverrides",
          'google_cloud_run_v2_job_iam_member.workflow_runs_jobs["convert-group"]': "roles/run.jobsExecutorWithOverrides",
          'google_cloud_run_v2_job_iam_member.workflow_runs_jobs["finalize"]': "roles/run.jobsExecutorWithOverrides",
          "google_project_iam_member.workflow_run_viewer": "roles/run.viewer",
          "google_storage_bucket_iam_member.workflow_destination_object_viewer": "roles/storage.objectViewer",
          "google_pubsub_topic_iam_member.workflow_events_publisher": "roles/pubsub.publisher",
          "google_project_iam_member.workflow_log_writer": "roles/logging.logWriter",
          "google_storage_bucket_iam_member.jobs_checkpoint_object_viewer": "roles/storage.objectViewer",
          "google_storage_bucket_iam_member.jobs_destination_object_user":
            'roles/storage.objectUser if resource.name.startsWith("projects/_/buckets/ckpts/objects/regular/step_") || ' +
            'resource.name.extract("projects/_/buckets/ckpts/objects/{root}/regular/step_") != "" || ' +
            'resource.name.startsWith("projects/_/buckets/ckpts/objects/regular/.orbax2reg/") || ' +
            'resource.name.extract("projects/_/buckets/ckpts/objects/{root}/regular/.orbax2reg/") != ""',
          "google_pubsub_topic_iam_member.jobs_events_publisher": "roles/pubsub.publisher",
          "google_project_iam_member.build_log_writer[0]": "roles/logging.logWriter",
          "google_artifact_registry_repository_iam_member.build_writes_function_images[0]": "roles/artifactregistry.writer",
          // The project number is read at apply, so the condition is only known then.
          "google_project_iam_member.build_reads_function_source[0]": "roles/storage.objectAdmin if (known after apply)",
          "google_project_iam_member.image_build_log_writer[0]": "roles/logging.logWriter",
          "google_artifact_registry_repository_iam_member.image_build_pushes_images[0]": "roles/artifactregistry.writer",
          "google_storage_bucket_iam_member.image_build_reads_sources[0]":
            'roles/storage.objectViewer if resource.name.startsWith("projects/_/buckets/my-project-orbax2reg-sources/objects/orbax2reg/image-builds/")',
        });
        expect(after(changes, "google_service_account.image_build[0]").account_id).toBe("orbax2reg-imgbuild");
        const claims = after(changes, "google_storage_bucket_iam_member.function_destination_claims");
        expect(claims.bucket).toBe("ckpts");
        expect(claims.member).toBe("serviceAccount:orbax2reg-fn@my-project.iam.gserviceaccount.com");
        expect(after(changes, 'google_cloud_run_v2_job_iam_member.workflow_runs_jobs["plan"]').name).toBe("orbax2reg-plan");
        expect(after(changes, "google_service_account.build[0]").account_id).toBe("orbax2reg-build");
      });

      test("the function builds, as the build account, into the module's own repository", async () => {
        // (Its environment_variables, ORBAX2REG_CLAIM_LEASE_SECONDS included, are "known after apply" to the provider,
        // so structure.test.ts checks them.)
        const c = changes.find((x) => x.address === "google_cloudfunctions2_function.on_checkpoint");
        const service = (c?.change.after?.service_config as Record<string, unknown>[] | undefined)?.[0];
        expect(service?.timeout_seconds).toBe(60);
        // Many events per instance, on the whole vCPU a concurrency above 1 needs.
        expect(service?.max_instance_request_concurrency).toBe(80);
        expect(service?.available_cpu).toBe("1");
        expect(service?.available_memory).toBe("512Mi");
        expect(service?.service_account_email).toBe("orbax2reg-fn@my-project.iam.gserviceaccount.com");
        const unknownBuild = (c?.change.after_unknown?.build_config as Record<string, unknown>[] | undefined)?.[0];
        expect(unknownBuild?.docker_repository).toBe(true); // the repository's id, created in this apply
        expect(unknownBuild?.service_account).toBe(true); // the build account's id, created in this apply
        expect(after(changes, 'google_artifact_registry_repository.docker["function_builds"]').repository_id).toBe(
          "orbax2reg-function-builds",
        );
      });
    });

    test("with a build service account given and the Pub/Sub agent grant on: no build account, its grants replaced by one", async () => {
      const { summary, changes } = await plan({
        function_build_service_account: "projects/my-project/serviceAccounts/builder@my-project.iam.gserviceaccount.com",
        pubsub_agent_token_creator: "true",
      });
      expect(summary).toBe("Plan: 51 to add, 0 to change, 0 to destroy.");
      const addresses = changes.map((c) => c.address);
      expect(addresses.filter((a) => /\.build(_|\[|$)/.test(a))).toEqual([]);
      expect(after(changes, "google_project_iam_member.pubsub_agent_token_creator[0]").role).toBe("roles/iam.serviceAccountTokenCreator");
      const fn = after(changes, "google_cloudfunctions2_function.on_checkpoint");
      expect((fn.build_config as Record<string, unknown>[])[0]?.service_account).toBe(
        "projects/my-project/serviceAccounts/builder@my-project.iam.gserviceaccount.com",
      );
    });

    test("with hf_export: the export job (its phases are args overrides), the workflow's grant to run it and the jobs' write grant on the exports only", async () => {
      const { summary, changes } = await plan({
        hf_export: '{every_n_steps = 5000, destination_template = "gs://{bucket}/{root}/hf/{step}", tasks = 8, keep_last_n = 3}',
      });
      // The default plan's 54, and the export job, the workflow's executor grant on it, the jobs' export write grant.
      expect(summary).toBe("Plan: 57 to add, 0 to change, 0 to destroy.");
      const job = after(changes, 'google_cloud_run_v2_job.phase["export-shards"]');
      expect(job.name).toBe("orbax2reg-export");
      const container = (job.template as { template: { containers: Record<string, unknown>[] }[] }[])[0]?.template[0]?.containers[0];
      expect(container?.args).toEqual(["dist/jobs/main.js", "export-shards"]);
      expect(container?.resources).toEqual([expect.objectContaining({ limits: { cpu: "1", memory: "1Gi" } })]);
      expect(container?.env).toEqual(expect.arrayContaining([{ name: "ORBAX2REG_EXPORT_KEEP_LAST_N", value: "3", value_source: [] }]));
      expect(after(changes, 'google_cloud_run_v2_job_iam_member.workflow_runs_jobs["export-shards"]')).toMatchObject({
        name: "orbax2reg-export",
        role: "roles/run.jobsExecutorWithOverrides",
      });
      const write = after(changes, "google_storage_bucket_iam_member.jobs_export_object_user[0]");
      expect(write.role).toBe("roles/storage.objectUser");
      expect((write.condition as { expression: string }[])[0]?.expression).toBe(
        'resource.name.startsWith("projects/_/buckets/ckpts/objects/hf/step_") || ' +
          'resource.name.extract("projects/_/buckets/ckpts/objects/{root}/hf/step_") != ""',
      );
    });

    test("with hf_export in the checkpoint bucket where no condition can tell exports from sources, the plan fails saying why", async () => {
      const r = await tryPlan({ hf_export: '{steps = [1000], destination_template = "gs://{bucket}/{root}/{step}"}' });
      expect(r.code).not.toBe(0);
      expect(r.out.replace(/\s+/g, " ")).toContain("puts the exports where no IAM condition can tell them from the source checkpoints");
    });

    test("with notification_channels: the Monitoring API and the three alert policies (failed conversion, dropped event, undelivered events) to those channels", async () => {
      const channel = "projects/my-project/notificationChannels/1234";
      const { summary, changes } = await plan({ notification_channels: JSON.stringify([channel]) });
      expect(summary).toBe("Plan: 58 to add, 0 to change, 0 to destroy.");
      expect(after(changes, 'google_project_service.required["monitoring.googleapis.com"]').service).toBe("monitoring.googleapis.com");
      // No log-based metric: the failed executions come from Workflows' built-in metric, which exists at the first apply.
      expect(changes.filter((c) => c.type === "google_logging_metric")).toEqual([]);
      const failed = after(changes, 'google_monitoring_alert_policy.pipeline["conversion_failed"]');
      expect(failed.notification_channels).toEqual([channel]);
      const threshold = (failed.conditions as { condition_threshold: { filter: string }[] }[])[0]?.condition_threshold[0];
      expect(threshold?.filter).toBe(
        'metric.type="workflows.googleapis.com/finished_execution_count" AND metric.labels.status="FAILED" AND ' +
          'resource.type="workflows.googleapis.com/Workflow" AND resource.labels.workflow_id="orbax2reg-convert" AND resource.labels.location="us-central1"',
      );
      const dropped = after(changes, 'google_monitoring_alert_policy.pipeline["event_dropped"]');
      expect(dropped.notification_channels).toEqual([channel]);
      const log = (dropped.conditions as { condition_matched_log: { filter: string }[] }[])[0]?.condition_matched_log[0];
      expect(log?.filter).toBe(
        'resource.type="cloud_run_revision" AND resource.labels.service_name="orbax2reg-on-checkpoint" AND ' +
          'jsonPayload.component="orbax2reg-trigger" AND severity>=ERROR',
      );
      const strategy = (dropped.alert_strategy as { notification_rate_limit: { period: string }[] }[])[0];
      expect(strategy?.notification_rate_limit[0]?.period).toBe("300s");
      // The undelivered-events policy's filter names the trigger's subscription, known once the function exists.
      const backlog = after(changes, 'google_monitoring_alert_policy.pipeline["event_backlog"]');
      expect(backlog.notification_channels).toEqual([channel]);
      const backlogThreshold = (backlog.conditions as { condition_threshold: { threshold_value: number }[] }[])[0]?.condition_threshold[0];
      expect(backlogThreshold?.threshold_value).toBe(600);
      const unknown = changes.find((c) => c.address === 'google_monitoring_alert_policy.pipeline["event_backlog"]')?.change
        .after_unknown as {
        conditions: { condition_threshold: { filter: boolean }[] }[];
      };
      expect(unknown.conditions[0]?.condition_threshold[0]?.filter).toBe(true);
    });

    test("with hf_export, notification_channels and dashboard: the export's alert policy and its two log-based metrics", async () => {
      const channel = "projects/my-project/notificationChannels/1234";
      const { summary, changes } = await plan({
        hf_export: '{every_n_steps = 5000, destination_template = "gs://{bucket}/{root}/hf/{step}"}',
        notification_channels: JSON.stringify([channel]),
        dashboard: "true",
      });
      // hf_export's 57, the Monitoring API, 4 alert policies, 5 log-based metrics and the dashboard.
      expect(summary).toBe("Plan: 68 to add, 0 to change, 0 to destroy.");
      const failed = after(changes, 'google_monitoring_alert_policy.pipeline["export_failed"]');
      expect(failed.display_name).toBe("orbax2reg: a Hugging Face export failed for good");
      expect(failed.notification_channels).toEqual([channel]);
      const log = (failed.conditions as { condition_matched_log: { filter: string }[] }[])[0]?.condition_matched_log[0];
      expect(log?.filter).toBe(
        'resource.type="cloud_run_job" AND resource.labels.job_name="orbax2reg-export" AND jsonPayload.component="orbax2reg-job" AND ' +
          'severity>=ERROR AND jsonPayload.permanent="true"',
      );
      const strategy = (failed.alert_strategy as { notification_rate_limit: { period: string }[] }[])[0];
      expect(strategy?.notification_rate_limit[0]?.period).toBe("300s");
      expect(after(changes, 'google_monitoring_alert_policy.pipeline["conversion_failed"]').display_name).toBe(
        "orbax2reg: a conversion or export failed",
      );
      expect(after(changes, 'google_logging_metric.pipeline["exports_committed"]')).toMatchObject({
        name: "orbax2reg/exports_committed",
        metric_descriptor: [{ metric_kind: "DELTA", value_type: "INT64", unit: "1" }],
      });
      expect(after(changes, 'google_logging_metric.pipeline["export_task_mb_per_second"]')).toMatchObject({
        value_extractor: "EXTRACT(jsonPayload.mbPerSecond)",
        metric_descriptor: [{ metric_kind: "DELTA", value_type: "DISTRIBUTION", unit: "MBy/s" }],
        bucket_options: [{ exponential_buckets: [{ num_finite_buckets: 20, growth_factor: 2, scale: 0.1 }] }],
      });
    });

    test("with dashboard = true: the Monitoring API, the three log-based metrics and the dashboard, its JSON known once the trigger exists", async () => {
      const { summary, changes } = await plan({ dashboard: "true" });
      expect(summary).toBe("Plan: 59 to add, 0 to change, 0 to destroy.");
      expect(after(changes, 'google_project_service.required["monitoring.googleapis.com"]').service).toBe("monitoring.googleapis.com");
      expect(after(changes, 'google_logging_metric.pipeline["conversions_started"]')).toMatchObject({
        name: "orbax2reg/conversions_started",
        metric_descriptor: [{ metric_kind: "DELTA", value_type: "INT64", unit: "1" }],
      });
      expect(after(changes, 'google_logging_metric.pipeline["trigger_starts"]').filter).toContain(
        'jsonPayload.message="conversion started"',
      );
      expect(after(changes, 'google_logging_metric.pipeline["conversion_seconds"]')).toMatchObject({
        value_extractor: "EXTRACT(jsonPayload.conversionSeconds)",
        metric_descriptor: [{ metric_kind: "DELTA", value_type: "DISTRIBUTION", unit: "s" }],
        bucket_options: [{ exponential_buckets: [{ num_finite_buckets: 30, growth_factor: 1.6, scale: 1 }] }],
      });
      // The backlog charts name the trigger's subscription, which exists once the function does (dashboard.test.ts
      // checks the JSON itself, evaluated with a trigger id given).
      const dashboard = changes.find((c) => c.address === "google_monitoring_dashboard.pipeline[0]");
      expect(dashboard?.change.actions).toEqual(["create"]);
      expect((dashboard?.change.after_unknown as { dashboard_json?: boolean } | undefined)?.dashboard_json).toBe(true);
    });

    test("in a region where some projects may not run Cloud Build, the plan fails saying to set image_build_region", async () => {
      const r = await tryPlan({ region: "europe-west4" });
      expect(r.code).not.toBe(0);
      expect(r.out.replace(/\s+/g, " ")).toContain(
        'region = "europe-west4" is not one of the regions where every project may run Cloud Build',
      );
      expect(r.out).toContain("image_build_region");
      const chosen = await plan({ region: "europe-west4", image_build_region: "europe-west1" });
      expect(chosen.summary).toBe("Plan: 54 to add, 0 to change, 0 to destroy.");
    });

    test("with package mirrors and a function build pool: the function builds in its pool, and the repositories have their cleanup policies", async () => {
      const pool = "projects/my-project/locations/us-central1/workerPools/private";
      const { changes } = await plan({
        npm_registry: "https://npm.mirror.example/",
        debian_mirror: "https://deb.mirror.example",
        function_build_worker_pool: pool,
      });
      const fn = after(changes, "google_cloudfunctions2_function.on_checkpoint");
      expect((fn.build_config as Record<string, unknown>[])[0]?.worker_pool).toBe(pool);
      const repo = after(changes, 'google_artifact_registry_repository.docker["images"]');
      expect(repo.cleanup_policies).toEqual([
        expect.objectContaining({
          id: "delete-old",
          action: "DELETE",
          condition: [expect.objectContaining({ tag_state: "ANY", older_than: "86400s" })],
        }),
        expect.objectContaining({ id: "keep-newest", action: "KEEP", most_recent_versions: [expect.objectContaining({ keep_count: 5 })] }),
      ]);
    });

    test("with a pinned image and a prebuilt function archive: nothing is built, no build account or sources read grant", async () => {
      const image = "us-docker.pkg.dev/other/images/orbax2reg@sha256:0123";
      const { summary, changes } = await plan({ image, function_source_object: "orbax2reg/function-0123456789abcdef.zip" });
      // 54 - the image's build, its account and its 3 grants - the function's archive.
      expect(summary).toBe("Plan: 48 to add, 0 to change, 0 to destroy.");
      expect(changes.map((c) => c.address).filter((a) => /image_build|google_storage_bucket_object|archive_file/.test(a))).toEqual([]);
      expect(jobImage(after(changes, 'google_cloud_run_v2_job.phase["plan"]'))).toBe(image);
    });

    describe("plan of examples/basic on an empty state, offline, with only its required variables", () => {
      let result: Awaited<ReturnType<typeof plan>>;
      const module = (address: string) => `module.orbax2reg.${address}`;

      beforeAll(async () => {
        const init = await tf(["init", "-backend=false", "-input=false", "-no-color"], EXAMPLE());
        expect(init.code, init.out).toBe(0);
        result = await plan({}, EXAMPLE(), { project_id: "my-project", checkpoint_bucket: "ckpts" });
      });

      test("creates everything, the jobs' image and the function's source included, in one apply", async () => {
        // The module's 54, the example's bucket for the regular checkpoints, and the jobs' read grant on it (a separate
        // destination bucket is listed and read through a grant of its own: iam.tf).
        expect(result.summary).toBe("Plan: 56 to add, 0 to change, 0 to destroy.");
        for (const address of [
          "terraform_data.image_build[0]",
          "google_storage_bucket.sources",
          "google_storage_bucket_object.function_source[0]",
          'google_cloud_run_v2_job.phase["plan"]',
          "google_cloudfunctions2_function.on_checkpoint",
        ])
          expect(result.changes.find((c) => c.address === module(address))?.change.actions, address).toEqual(["create"]);
        // Without trigger_region the bucket's location is read, after the APIs are enabled: at apply, no call now.
        const reads = result.changes.filter((c) => c.change.actions.join() === "read").map((c) => c.address);
        expect(reads).toContain(module("data.google_storage_bucket.checkpoint[0]"));
      });

      test("the jobs run the image the build pushes, tagged with its sources' identity, and depend on the build", async () => {
        const tag = moduleSources().imageTag;
        const image = `us-central1-docker.pkg.dev/my-project/orbax2reg/orbax2reg:${tag}`;
        for (const phase of ["plan", "convert-group", "finalize"]) {
          const job = result.changes.find((c) => c.address === module(`google_cloud_run_v2_job.phase["${phase}"]`))?.change.after;
          expect(jobImage(job)).toBe(image);
        }
        expect(result.changes.find((c) => c.address === module("terraform_data.image_build[0]"))?.change.after?.triggers_replace).toBe(
          image,
        );
        const resources = (
          result.configuration as {
            root_module: { module_calls: { orbax2reg: { module: { resources: { address: string; depends_on?: string[] }[] } } } };
          }
        ).root_module.module_calls.orbax2reg.module.resources;
        expect(resources.find((r) => r.address === "google_cloud_run_v2_job.phase")?.depends_on).toContain("terraform_data.image_build");
      });

      test("the regular checkpoints go to a bucket of the example's own, not the watched one: uniform access, soft delete off", async () => {
        const bucket = result.changes.find((c) => c.address === "google_storage_bucket.regular[0]")?.change.after;
        expect(bucket).toMatchObject({
          name: "my-project-orbax2reg-regular",
          location: "US-CENTRAL1",
          uniform_bucket_level_access: true,
          public_access_prevention: "enforced",
          force_destroy: false,
          soft_delete_policy: [{ retention_duration_seconds: 0 }],
        });
        // The function claims, and the jobs write, there (the template itself: test/terraform/cli.test.ts, deployed settings).
        for (const grant of [
          "google_storage_bucket_iam_member.function_destination_claims",
          "google_storage_bucket_iam_member.jobs_destination_object_viewer[0]",
        ])
          expect(result.changes.find((c) => c.address === module(grant))?.change.after?.bucket, grant).toBe("my-project-orbax2reg-regular");
      });

      test("with convert_into_checkpoint_bucket, no bucket is created and the steps go next to the Orbax ones", async () => {
        const into = await plan({}, EXAMPLE(), {
          project_id: "my-project",
          checkpoint_bucket: "ckpts",
          convert_into_checkpoint_bucket: "true",
        });
        expect(into.summary).toBe("Plan: 54 to add, 0 to change, 0 to destroy.");
        expect(into.changes.find((c) => c.address === "google_storage_bucket.regular[0]")).toBeUndefined();
        expect(
          into.changes.find((c) => c.address === module("google_storage_bucket_iam_member.function_destination_claims"))?.change.after
            ?.bucket,
        ).toBe("ckpts");
      });

      test("the function's source object is named by its identity", async () => {
        const object = result.changes.find((c) => c.address === module("google_storage_bucket_object.function_source[0]"))?.change.after;
        expect(object?.name).toBe(moduleSources().functionObject);
        expect(object?.bucket).toBe("my-project-orbax2reg-sources");
      });

      test("the archives terraform wrote hold exactly the files sources.tf lists, and the function's package.json and lockfile", async () => {
        const sources = moduleSources();
        const dir = join(EXAMPLE(), ".terraform/orbax2reg");
        // assets/ (binary) goes in base64, under a .b64 name the Dockerfile decodes.
        const inArchive = sources.imageFiles.map((f) => (f.startsWith("assets/") ? `${f}.b64` : f)).sort();
        expect(zipEntries(join(dir, "image-source.zip"))).toEqual(inArchive);
        expect(zipEntries(join(dir, "function-source.zip"))).toEqual(
          [...sources.functionFiles, "package.json", "package-lock.json"].sort(),
        );
      });
    });

    test("lock files are made in the temporary copy only, and terraform/.gitignore keeps them out of git", async () => {
      expect(existsSync(join(MODULE(), ".terraform.lock.hcl"))).toBe(true);
      expect(readFileSync("terraform/.gitignore", "utf8")).toMatch(/^\.terraform\.lock\.hcl$/m);
    });
  },
);
