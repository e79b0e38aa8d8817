// A later `terraform apply` of a deployed module, planned with the real hashicorp/google provider (from the filesystem
// mirror provider.test.ts uses; these tests skip without it) against a terraform state as a first apply leaves it:
// - turning on the dashboard and the alerts (which adds the Monitoring API) keeps the grants to Google's service
//   agents in place: no replacement, during which Cloud Storage could not publish the bucket's events to Eventarc
//   (terraform/modules/orbax2reg/apis.tf says why the data sources wait for terraform_data.apis_enabled);
// - without that resource in the state (a deployment made by an earlier version of the module) the next plan, even with
//   the same variables, replaces them, which is what terraform/README.md's upgrade step (`-target` it first) avoids;
// - alert policies and log-based metrics an earlier version made under other addresses are moved, not replaced;
// - the dashboard as the Monitoring API answers it back plans no change (hashicorp/terraform-provider-google#16173).
//
// A later plan reads the data sources at plan time, so a stand-in answers the three reads (the project, its Cloud
// Storage service agent, the destination bucket) over HTTP, through the provider's custom endpoints
// (GOOGLE_RESOURCE_MANAGER_CUSTOM_ENDPOINT, GOOGLE_CLOUD_BILLING_CUSTOM_ENDPOINT, GOOGLE_STORAGE_CUSTOM_ENDPOINT). The
// state is written from a first plan's values, with what only the apply learns (ids, emails, the agents) filled in as
// Google would return it.
import { randomUUID } from "node:crypto";
import { cpSync, mkdirSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { basename, join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { moduleDashboard } from "../helpers/dashboard-json.js";
import { MODULE_REPOSITORY_FILES } from "../helpers/sources.js";
import {
  GOOGLE_PROVIDER_VERSION,
  mirrorCliConfig,
  type PlannedChange,
  planAndShow,
  providerMirror,
  terraformAsync,
} from "../helpers/terraform.js";
import { tempDir } from "../helpers/tmp.js";

const { mirror, missing, present } = providerMirror();
const WHY_SKIPPED = `skipped: no ${missing.join(", ")} (see provider.test.ts)`;
if (!present) console.warn(`test/terraform/later-apply.test.ts ${WHY_SKIPPED}`);

const PROJECT_NUMBER = "123456789012";
const GCS_AGENT = `service-${PROJECT_NUMBER}@gs-project-accounts.iam.gserviceaccount.com`;
const PUBSUB_AGENT = `service-${PROJECT_NUMBER}@gcp-sa-pubsub.iam.gserviceaccount.com`;
const REPOSITORY_FILES = MODULE_REPOSITORY_FILES;
/** The deployment: the module's required variables, both agent grants on, the trigger's region given. */
const DEPLOYED: Record<string, string> = {
  project_id: "my-project",
  region: "us-central1",
  checkpoint_bucket: "ckpts",
  trigger_region: "us-central1",
  pubsub_agent_token_creator: "true",
};
const LATER: Record<string, string> = {
  ...DEPLOYED,
  dashboard: "true",
  notification_channels: '["projects/my-project/notificationChannels/1"]',
};
const GRANTS = [
  "google_project_iam_member.gcs_agent_pubsub_publisher",
  "google_project_iam_member.pubsub_agent_token_creator[0]",
  "google_project_iam_member.build_reads_function_source[0]",
];

/** Google's answers to the reads a later plan makes; every request is recorded. */
/** A terraform state file (format 4, as terraform 1.11 writes it) holding `resources`, in a new folder: its path. */
function stateFile(resources: unknown[]): string {
  const file = join(tempDir("tf-state"), "terraform.tfstate");
  writeFileSync(
    file,
    JSON.stringify({ version: 4, terraform_version: "1.11.4", serial: 1, lineage: randomUUID(), outputs: {}, resources }),
  );
  return file;
}

function standIn(requests: string[]): Server {
  return createServer((req, res) => {
    const path = (req.url ?? "").split("?")[0] ?? "";
    requests.push(`${req.method} ${path}`);
    const json = (status: number, body: unknown) => {
      res.writeHead(status, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    if (path === "/crm/v1/projects/my-project")
      json(200, { projectNumber: PROJECT_NUMBER, projectId: "my-project", name: "my-project", lifecycleState: "ACTIVE" });
    else if (path === "/billing/v1/projects/my-project/billingInfo")
      json(200, { name: "projects/my-project/billingInfo", projectId: "my-project" });
    else if (path === "/storage/v1/projects/my-project/serviceAccount")
      json(200, { kind: "storage#serviceAccount", email_address: GCS_AGENT });
    else if (path === "/storage/v1/b/ckpts")
      json(200, {
        kind: "storage#bucket",
        id: "ckpts",
        name: "ckpts",
        projectNumber: PROJECT_NUMBER,
        location: "US-CENTRAL1",
        locationType: "region",
        storageClass: "STANDARD",
        iamConfiguration: { uniformBucketLevelAccess: { enabled: true }, publicAccessPrevention: "enforced" },
      });
    else json(404, { error: { code: 404, message: `no stand-in for ${path}`, errors: [{ reason: "notFound" }] } });
  });
}

describe.skipIf(!present)(`a later apply of a deployed module, planned with hashicorp/google v${GOOGLE_PROVIDER_VERSION}`, () => {
  let root = "";
  let cliConfig = "";
  let server: Server;
  let base = "";
  const requests: string[] = [];
  const DIR = () => join(root, "terraform/later");
  const env = () => ({
    GOOGLE_OAUTH_ACCESS_TOKEN: "dummy",
    GOOGLE_CREDENTIALS: undefined,
    GOOGLE_APPLICATION_CREDENTIALS: undefined,
    GOOGLE_IMPERSONATE_SERVICE_ACCOUNT: undefined,
    GOOGLE_RESOURCE_MANAGER_CUSTOM_ENDPOINT: `${base}/crm/v1/`,
    GOOGLE_CLOUD_BILLING_CUSTOM_ENDPOINT: `${base}/billing/v1/`,
    GOOGLE_STORAGE_CUSTOM_ENDPOINT: `${base}/storage/v1/`,
  });
  const tf = (args: string[], dir = DIR()) => terraformAsync(args, dir, { cliConfig, env: env(), timeoutMs: 300_000 });
  const schemaVersions: Record<string, number> = {};
  let firstPlan: PlannedChange[] = [];

  /** The root that deploys the module: module "orbax2reg" with `vars`, written into `dir`. */
  function writeRoot(dir: string, vars: Record<string, string>) {
    const value = (v: string) => (v.startsWith("[") || v === "true" ? v : JSON.stringify(v));
    writeFileSync(
      join(dir, "main.tf"),
      `module "orbax2reg" {\n  source = "../modules/orbax2reg"\n${Object.entries(vars)
        .map(([k, v]) => `  ${k} = ${value(v)}\n`)
        .join("")}}\n`,
    );
  }

  const planJson = (state: string, ...extra: string[]) =>
    planAndShow((args) => tf(args), ["-refresh=false", "-input=false", "-no-color", "-lock=false", `-state=${state}`, ...extra]);

  /** What Google answers with once the first apply made them: the values the first plan could not know. */
  function filled(c: PlannedChange): Record<string, unknown> {
    const a = { ...(c.change.after ?? {}) };
    const address = c.address.replace(/^module\.orbax2reg\./, "");
    if (c.type === "google_project_service") return { ...a, id: `my-project/${String(a.service)}` };
    if (c.type === "terraform_data") return { ...a, id: randomUUID(), output: null };
    if (c.type === "google_service_account") {
      const email = `${String(a.account_id)}@my-project.iam.gserviceaccount.com`;
      const name = `projects/my-project/serviceAccounts/${email}`;
      return { ...a, email, id: name, name, member: `serviceAccount:${email}`, unique_id: "100000000000000000001" };
    }
    const member: Record<string, string> = {
      "google_project_iam_member.gcs_agent_pubsub_publisher": `serviceAccount:${GCS_AGENT}`,
      "google_project_iam_member.pubsub_agent_token_creator[0]": `serviceAccount:${PUBSUB_AGENT}`,
      "google_project_iam_member.build_reads_function_source[0]": "serviceAccount:orbax2reg-build@my-project.iam.gserviceaccount.com",
    };
    const grant: Record<string, unknown> = { ...a, member: member[address] ?? a.member, etag: "BwYAAAAAAAA=" };
    if (address === "google_project_iam_member.build_reads_function_source[0]") {
      const [condition] = a.condition as Record<string, unknown>[];
      grant.condition = [
        {
          ...condition,
          expression: `resource.name.startsWith("projects/_/buckets/gcf-v2-sources-${PROJECT_NUMBER}-us-central1/objects/orbax2reg-on-checkpoint/")`,
        },
      ];
    }
    return { ...grant, id: `my-project/${String(a.role)}/${grant.member}` };
  }

  /** A state holding the first plan's APIs, gate (unless left out), build account and agent grants, as applied. */
  function deployedState(o: { gate: boolean }): string {
    const wanted = (c: PlannedChange) =>
      c.mode === "managed" &&
      (c.type === "google_project_service" ||
        (o.gate && c.type === "terraform_data" && c.name === "apis_enabled") ||
        c.address === "module.orbax2reg.google_service_account.build[0]" ||
        GRANTS.includes(c.address.replace(/^module\.orbax2reg\./, "")));
    const resources = new Map<
      string,
      { module: string; mode: string; type: string; name: string; provider: string; instances: unknown[] }
    >();
    for (const c of firstPlan.filter(wanted)) {
      const key = `${c.type}.${c.name}`;
      const r = resources.get(key) ?? {
        module: "module.orbax2reg",
        mode: "managed",
        type: c.type,
        name: c.name,
        provider: `provider["${c.provider_name}"]`,
        instances: [],
      };
      r.instances.push({
        ...(c.index === undefined ? {} : { index_key: c.index }),
        schema_version: schemaVersions[c.type] ?? 0,
        attributes: filled(c),
        sensitive_attributes: [],
      });
      resources.set(key, r);
    }
    return stateFile([...resources.values()]);
  }

  beforeAll(async () => {
    server = standIn(requests);
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    root = tempDir("tf-later");
    const skip = (src: string) => ![".terraform", ".terraform.lock.hcl", "terraform.tfstate", "terraform.tfvars"].includes(basename(src));
    cpSync("terraform", join(root, "terraform"), { recursive: true, filter: skip });
    for (const entry of REPOSITORY_FILES) cpSync(entry, join(root, entry), { recursive: true });
    mkdirSync(DIR());
    cliConfig = mirrorCliConfig(mirror);
    writeRoot(DIR(), DEPLOYED);
    const init = await tf(["init", "-backend=false", "-input=false", "-no-color"]);
    expect(init.code, init.out).toBe(0);
    const schemas = await tf(["providers", "schema", "-json"]);
    expect(schemas.code, schemas.out).toBe(0);
    const json = JSON.parse(schemas.stdout) as {
      provider_schemas: Record<string, { resource_schemas: Record<string, { version: number }> }>;
    };
    for (const p of Object.values(json.provider_schemas))
      for (const [type, s] of Object.entries(p.resource_schemas ?? {})) schemaVersions[type] = s.version;
    // The first apply's plan, on an empty state: what the state is written from.
    const first = await planJson(join(tempDir("tf-state"), "empty.tfstate"));
    expect(first.code, first.out).toBe(0);
    firstPlan = first.changes;
  }, 600_000);

  afterAll(() => server?.close());

  test("turning on the dashboard and the alerts keeps the agents' grants, the reads made at plan time", async () => {
    writeRoot(DIR(), LATER);
    requests.length = 0;
    const later = await planJson(deployedState({ gate: true }));
    expect(later.code, later.out).toBe(0);
    const actions = (address: string) => later.changes.find((c) => c.address === `module.orbax2reg.${address}`)?.change.actions;
    for (const grant of GRANTS) expect(actions(grant), grant).toEqual(["no-op"]);
    expect(actions('google_project_service.required["monitoring.googleapis.com"]')).toEqual(["create"]);
    expect(actions("terraform_data.apis_enabled")).toEqual(["no-op"]);
    // No read left for apply: each was made now, against the stand-in.
    expect(later.changes.filter((c) => c.change.actions.includes("read")).map((c) => c.address)).toEqual([]);
    expect(requests).toEqual(
      expect.arrayContaining([
        "GET /crm/v1/projects/my-project",
        "GET /storage/v1/projects/my-project/serviceAccount",
        "GET /storage/v1/b/ckpts",
      ]),
    );
  }, 300_000);

  test("upgrading a deployment an earlier version made (no terraform_data.apis_enabled) would replace them once; -target of it first creates it alone", async () => {
    writeRoot(DIR(), DEPLOYED);
    const state = deployedState({ gate: false });
    const upgrade = await planJson(state);
    expect(upgrade.code, upgrade.out).toBe(0);
    for (const grant of GRANTS) {
      const change = upgrade.changes.find((c) => c.address === `module.orbax2reg.${grant}`);
      expect(change?.change.actions.sort(), grant).toEqual(["create", "delete"]);
    }
    const targeted = await planJson(state, "-target=module.orbax2reg.terraform_data.apis_enabled");
    expect(targeted.code, targeted.out).toBe(0);
    expect(targeted.summary).toBe("Plan: 1 to add, 0 to change, 0 to destroy.");
    expect(targeted.changes.filter((c) => c.change.actions.join() !== "no-op").map((c) => c.address)).toEqual([
      "module.orbax2reg.terraform_data.apis_enabled",
    ]);
  }, 300_000);

  test("alert policies, log-based metrics and repositories deployed under their earlier addresses are moved, not replaced", async () => {
    // Where the versions before alerts.tf's, dashboard.tf's and artifact_registry.tf's tables kept them (those files'
    // moved blocks).
    const earlier: Record<string, string> = {
      'google_artifact_registry_repository.docker["images"]': "google_artifact_registry_repository.images",
      'google_artifact_registry_repository.docker["function_builds"]': "google_artifact_registry_repository.function_builds",
      'google_monitoring_alert_policy.pipeline["conversion_failed"]': "google_monitoring_alert_policy.conversion_failed[0]",
      'google_monitoring_alert_policy.pipeline["event_dropped"]': "google_monitoring_alert_policy.event_dropped[0]",
      'google_monitoring_alert_policy.pipeline["event_backlog"]': "google_monitoring_alert_policy.event_backlog[0]",
      'google_logging_metric.pipeline["conversions_started"]': 'google_logging_metric.count["conversions_started"]',
      'google_logging_metric.pipeline["trigger_starts"]': 'google_logging_metric.count["trigger_starts"]',
      'google_logging_metric.pipeline["conversion_seconds"]': "google_logging_metric.conversion_seconds[0]",
    };
    writeRoot(DIR(), LATER);
    const first = await planJson(join(tempDir("tf-state"), "empty.tfstate"));
    expect(first.code, first.out).toBe(0);
    // The state an apply of that version left: the same values (the plans are the same), under the earlier addresses.
    const resources = new Map<
      string,
      { module: string; mode: string; type: string; name: string; provider: string; instances: unknown[] }
    >();
    for (const c of first.changes) {
      const was = earlier[c.address.replace(/^module\.orbax2reg\./, "")];
      if (was === undefined) continue;
      const [, name, index] = /^\w+\.(\w+)(?:\[(.+)\])?$/.exec(was) as RegExpExecArray;
      const r = resources.get(`${c.type}.${name}`) ?? {
        module: "module.orbax2reg",
        mode: "managed",
        type: c.type,
        name: name as string,
        provider: `provider["${c.provider_name}"]`,
        instances: [],
      };
      const id =
        c.type === "google_monitoring_alert_policy"
          ? `projects/my-project/alertPolicies/${r.instances.length + 1}`
          : c.type === "google_artifact_registry_repository"
            ? `projects/my-project/locations/us-central1/repositories/${c.change.after?.repository_id}`
            : `my-project/${c.change.after?.name}`;
      // The resource name the API gives back, where it is not the configured one.
      const named = { google_monitoring_alert_policy: id, google_artifact_registry_repository: c.change.after?.repository_id }[c.type];
      r.instances.push({
        ...(index === undefined ? {} : { index_key: JSON.parse(index) }),
        schema_version: schemaVersions[c.type] ?? 0,
        attributes: { ...c.change.after, id, ...(named === undefined ? {} : { name: named }) },
        sensitive_attributes: [],
      });
      resources.set(`${c.type}.${name}`, r);
    }
    expect([...resources.values()].flatMap((r) => r.instances)).toHaveLength(8);
    const state = stateFile([...resources.values()]);
    const later = await planJson(state);
    expect(later.code, later.out).toBe(0);
    for (const [now, was] of Object.entries(earlier)) {
      const change = later.changes.find((c) => c.address === `module.orbax2reg.${now}`);
      expect(change?.previous_address, now).toBe(`module.orbax2reg.${was}`);
      // The backlog policy's filter names the trigger, which this state does not hold: an update in place at most.
      expect(["no-op", "update"], now).toContain(change?.change.actions.join());
    }
    expect(later.changes.filter((c) => c.change.actions.includes("delete")).map((c) => c.address)).toEqual([]);
  }, 600_000);

  describe("the dashboard, as the Monitoring API answers it back (zero-valued fields left out), plans no change", () => {
    const dir = () => join(root, "terraform/dashboard");
    let configured: Record<string, unknown> = {};

    /** The API's answer: proto3 JSON leaves out fields at their default (0, false, "", []), and adds name and etag. */
    const asAnswered = (v: unknown): unknown => {
      if (Array.isArray(v)) return v.map(asAnswered);
      if (v === null || typeof v !== "object") return v;
      const out: Record<string, unknown> = {};
      for (const [k, x] of Object.entries(v)) {
        if (x === 0 || x === false || x === "" || (Array.isArray(x) && x.length === 0)) continue;
        out[k] = asAnswered(x);
      }
      return out;
    };

    async function planWith(json: unknown): Promise<string> {
      writeFileSync(join(dir(), "dashboard.json"), JSON.stringify(json));
      const answered = {
        ...(asAnswered(configured) as Record<string, unknown>),
        name: `projects/${PROJECT_NUMBER}/dashboards/d1`,
        etag: "e1",
      };
      const state = stateFile([
        {
          mode: "managed",
          type: "google_monitoring_dashboard",
          name: "pipeline",
          provider: 'provider["registry.terraform.io/hashicorp/google"]',
          instances: [
            {
              schema_version: schemaVersions.google_monitoring_dashboard ?? 0,
              attributes: {
                id: `projects/${PROJECT_NUMBER}/dashboards/d1`,
                project: "my-project",
                dashboard_json: JSON.stringify(answered),
                deletion_policy: "DELETE",
              },
              sensitive_attributes: [],
            },
          ],
        },
      ]);
      const r = await tf(["plan", "-refresh=false", "-input=false", "-no-color", "-lock=false", `-state=${state}`], dir());
      expect(r.code, r.out).toBe(0);
      return r.stdout.split("\n").find((l) => l.startsWith("Plan: ") || l.startsWith("No changes.")) ?? r.out;
    }

    beforeAll(async () => {
      configured = (await moduleDashboard()).dashboard;
      mkdirSync(dir(), { recursive: true });
      // The provider's own resource, configured with the dashboard's JSON from a file (the module's expression for it
      // needs the trigger, which only an apply makes).
      const tfFile = [
        "terraform {",
        "  required_providers {",
        `    google = { source = "hashicorp/google", version = "${GOOGLE_PROVIDER_VERSION}" }`,
        "  }",
        "}",
        'resource "google_monitoring_dashboard" "pipeline" {',
        '  project        = "my-project"',
        '  dashboard_json = file("dashboard.json")',
        "}",
      ];
      writeFileSync(join(dir(), "main.tf"), `${tfFile.join("\n")}\n`);
      const init = await tf(["init", "-backend=false", "-input=false", "-no-color"], dir());
      expect(init.code, init.out).toBe(0);
    }, 300_000);

    test("the module's JSON, which leaves out positions of 0: no changes", async () => {
      expect(await planWith(configured)).toMatch(/^No changes\./);
    }, 300_000);

    test("the same JSON with the first tile's xPos and yPos of 0 written out: a change at every plan", async () => {
      const layout = configured.mosaicLayout as { tiles: Record<string, unknown>[] };
      const [first, ...rest] = layout.tiles;
      const explicit = { ...configured, mosaicLayout: { ...layout, tiles: [{ xPos: 0, yPos: 0, ...first }, ...rest] } };
      expect(await planWith(explicit)).toBe("Plan: 0 to add, 1 to change, 0 to destroy.");
    }, 300_000);
  });
});
