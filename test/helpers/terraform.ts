// The real terraform binary for tests: .tools/bin/terraform when scripts/install.sh built the pinned one,
// otherwise the machine's own `terraform` on PATH (install.sh checks its version).
import { spawnSync } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join, resolve } from "node:path";
import { TOOLS } from "./paths.js";
import { run } from "./run.js";
import { tempDir } from "./tmp.js";

export const TERRAFORM = existsSync(resolve(TOOLS, "terraform")) ? resolve(TOOLS, "terraform") : "terraform";

/** The version scripts/install.sh pins (keep the two in step). */
export const TERRAFORM_VERSION = "1.11.4";

let cliConfig: string | undefined;

type TerraformOptions = { env?: NodeJS.ProcessEnv; cliConfig?: string; timeoutMs?: number };

/** The environment every terraform run gets: its own CLI configuration (made once), no colour, no prompts. */
function terraformEnv(o: TerraformOptions): NodeJS.ProcessEnv {
  if (o.cliConfig === undefined && cliConfig === undefined) {
    cliConfig = join(tempDir("tf-cli"), "terraformrc");
    writeFileSync(cliConfig, "");
  }
  return {
    ...process.env,
    TF_CLI_CONFIG_FILE: o.cliConfig ?? cliConfig,
    TF_IN_AUTOMATION: "1",
    NO_COLOR: "1",
    CHECKPOINT_DISABLE: "1",
    ...o.env,
  };
}

/**
 * Runs terraform with an empty CLI configuration of its own (a machine's TF_CLI_CONFIG_FILE may point at a
 * missing file or at provider mirrors the test did not ask for), no colour, no prompts.
 */
export function terraform(args: string[], cwd: string, o: TerraformOptions = {}): { code: number; out: string; stdout: string } {
  const r = spawnSync(TERRAFORM, args, {
    cwd,
    encoding: "utf8",
    timeout: o.timeoutMs ?? 120_000,
    // A plan's JSON carries the module's source archives' contents (hashicorp/archive keeps them in the state): megabytes.
    maxBuffer: 256 * 1024 * 1024,
    env: terraformEnv(o),
  });
  if (r.error) throw new Error(`${TERRAFORM}: ${r.error.message} (run scripts/install.sh)`);
  return { code: r.status ?? -1, out: `${r.stdout ?? ""}${r.stderr ?? ""}`, stdout: r.stdout ?? "" };
}

/**
 * terraform() without blocking the test worker, for the long runs (init with a provider mirror, plan, show of a
 * whole deployment): test/helpers/run.ts says why a worker must not be blocked for a minute.
 */
export async function terraformAsync(
  args: string[],
  cwd: string,
  o: TerraformOptions = {},
): Promise<{ code: number; out: string; stdout: string }> {
  const r = await run(TERRAFORM, args, { cwd, timeout: o.timeoutMs ?? 120_000, env: terraformEnv(o) });
  return { code: r.code ?? -1, out: `${r.stdout}${r.stderr}`, stdout: r.stdout };
}

/** A planned resource, as `terraform show -json` of a plan lists it (resource_changes). */
export interface PlannedChange {
  address: string;
  /** The address a `moved` block moved it from. */
  previous_address?: string;
  mode: string;
  type: string;
  name: string;
  index?: string | number;
  provider_name: string;
  change: { actions: string[]; after: Record<string, unknown> | null; after_unknown?: Record<string, unknown> };
}

/**
 * `terraform plan` with `args`, saved, then `terraform show -json` of it, through `tf` (a test's terraformAsync with
 * its directory and environment): the summary line ("Plan: ..." or "No changes. ..."), the planned changes and the
 * configuration. A failed plan: its exit code and output, nothing else.
 */
export async function planAndShow(
  tf: (args: string[]) => Promise<{ code: number; out: string; stdout: string }>,
  args: string[],
): Promise<{ code: number; out: string; summary: string; changes: PlannedChange[]; configuration: Record<string, unknown> }> {
  const saved = join(tempDir("tf-plan"), "tfplan");
  const r = await tf(["plan", ...args, `-out=${saved}`]);
  if (r.code !== 0) return { code: r.code, out: r.out, summary: "", changes: [], configuration: {} };
  const shown = await tf(["show", "-json", saved]);
  if (shown.code !== 0) throw new Error(`terraform show -json ${saved}: ${shown.out}`);
  const json = JSON.parse(shown.stdout) as { resource_changes?: PlannedChange[]; configuration: Record<string, unknown> };
  const summary = r.stdout.split("\n").find((l) => l.startsWith("Plan: ") || l.startsWith("No changes.")) ?? "";
  return { code: 0, out: r.out, summary, changes: json.resource_changes ?? [], configuration: json.configuration };
}

/**
 * `terraform apply` of an initialised configuration that has no resources (variables, locals, outputs: no
 * provider needed), into a state of its own, then the values of its outputs. `args` adds -var / -var-file.
 */
export function applyForOutputs(dir: string, args: string[]): { code: number; out: string; outputs: Record<string, unknown> } {
  const state = join(tempDir("tf-state"), "s.tfstate");
  const r = terraform(["apply", "-input=false", "-auto-approve", "-no-color", `-state=${state}`, ...args], dir);
  if (r.code !== 0) return { code: r.code, out: r.out, outputs: {} };
  const o = terraform(["output", "-json", "-no-color", `-state=${state}`], dir);
  const parsed = JSON.parse(o.stdout) as Record<string, { value: unknown }>;
  return { code: r.code, out: r.out, outputs: Object.fromEntries(Object.entries(parsed).map(([k, v]) => [k, v.value])) };
}

/** The hashicorp/google version the module's `~> 7.45` is checked against (docs and local build). */
export const GOOGLE_PROVIDER_VERSION = "7.45.0";
/** The hashicorp/archive version the module's `~> 2.7` is checked against (local build, like the google provider's). */
export const ARCHIVE_PROVIDER_VERSION = "2.7.1";

/**
 * A filesystem mirror holding the providers the module needs (hashicorp/google and hashicorp/archive):
 * $ORBAX2REG_TF_PROVIDER_MIRROR, else ~/.terraform.d/plugins. `missing` lists the binaries not there, by their path in the
 * mirror's unpacked layout; `present` says whether none is missing.
 */
export function providerMirror(): { mirror: string; missing: string[]; present: boolean } {
  const mirror = resolve(process.env.ORBAX2REG_TF_PROVIDER_MIRROR || join(homedir(), ".terraform.d", "plugins"));
  const binary = (name: string, version: string) =>
    join(mirror, `registry.terraform.io/hashicorp/${name}`, version, "linux_amd64", `terraform-provider-${name}_v${version}`);
  const missing = [binary("google", GOOGLE_PROVIDER_VERSION), binary("archive", ARCHIVE_PROVIDER_VERSION)].filter((b) => !existsSync(b));
  return { mirror, missing, present: process.platform === "linux" && process.arch === "x64" && missing.length === 0 };
}
/** A CLI configuration that installs providers from `mirror` only (no registry, no network). */
export function mirrorCliConfig(mirror: string): string {
  const file = join(tempDir("tf-cli"), "terraformrc");
  writeFileSync(file, `provider_installation {\n  filesystem_mirror {\n    path = ${JSON.stringify(mirror)}\n  }\n}\n`);
  return file;
}
