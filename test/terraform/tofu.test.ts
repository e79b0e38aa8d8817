// Checks that need a real Terraform/OpenTofu binary: `tofu fmt`, and evaluating the module's variable validations and
// derived checks (variables.tf + main.tf hold no resource or data source, so `tofu apply` runs them offline with no
// provider). OpenTofu is built into .tools/bin/tofu by hand (tools/README.md §5); without it these tests are skipped.
import { spawnSync } from "node:child_process";
import { copyFileSync, existsSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { TOOLS } from "../helpers/paths.js";
import { tempDir } from "../helpers/tmp.js";

const TOFU = resolve(TOOLS, "tofu");
const HAVE_TOFU = existsSync(TOFU);
const MODULE = resolve("terraform/modules/orbax2reg");

function tofu(args: string[], cwd: string): { code: number; out: string } {
  // The machine's TF_CLI_CONFIG_FILE points at a missing file (a warning on every command): use an empty one.
  const cliConfig = join(tempDir("tofu-cli"), "tofurc");
  writeFileSync(cliConfig, "");
  const r = spawnSync(TOFU, args, {
    cwd,
    encoding: "utf8",
    timeout: 60_000,
    env: { ...process.env, TF_CLI_CONFIG_FILE: cliConfig, TF_IN_AUTOMATION: "1", NO_COLOR: "1" },
  });
  return { code: r.status ?? -1, out: `${r.stdout ?? ""}${r.stderr ?? ""}` };
}

describe.skipIf(!HAVE_TOFU)("tofu (skipped when .tools/bin/tofu is absent)", () => {
  test("tofu fmt -check -recursive terraform exits 0 (skipped when .tools/bin/tofu is absent)", () => {
    const r = tofu(["fmt", "-check", "-recursive", "-diff", "terraform"], process.cwd());
    expect(r.out).toBe("");
    expect(r.code).toBe(0);
  });

  describe("module checks evaluated offline (skipped when .tools/bin/tofu is absent)", () => {
    let dir = "";
    const REQUIRED = {
      project_id: "my-project",
      region: "us-central1",
      checkpoint_bucket: "ckpts",
      function_source_bucket: "src-bucket",
      function_source_object: "fn/orbax2reg-0123.zip",
    };

    /** Applies variables.tf + main.tf (variables and locals only) with these values; returns the locals or the error. */
    function evaluate(vars: Record<string, string | undefined>): { code: number; out: string; locals: Record<string, unknown> } {
      const state = join(tempDir("tofu-state"), "s.tfstate");
      const args = ["apply", "-input=false", "-auto-approve", "-no-color", `-state=${state}`];
      for (const [k, v] of Object.entries({ ...REQUIRED, ...vars })) if (v !== undefined) args.push("-var", `${k}=${v}`);
      const r = tofu(args, dir);
      if (r.code !== 0) return { ...r, locals: {} };
      const o = tofu(["output", "-json", "-no-color", `-state=${state}`], dir);
      const parsed = JSON.parse(o.out) as Record<string, { value: unknown }>;
      return { ...r, locals: Object.fromEntries(Object.entries(parsed).map(([k, v]) => [k, v.value])) };
    }

    beforeAll(() => {
      dir = tempDir("tofu-module");
      copyFileSync(join(MODULE, "variables.tf"), join(dir, "variables.tf"));
      copyFileSync(join(MODULE, "main.tf"), join(dir, "main.tf"));
      writeFileSync(
        join(dir, "probe.tf"),
        ["destination_bucket", "destination_matches_template", "function_source_given", "job_shape_ok", "job_wait_fits", "names"]
          .map((l) => `output "${l}" {\n  value = local.${l}\n}\n`)
          .join("\n"),
      );
      const init = tofu(["init", "-backend=false", "-input=false", "-no-color"], dir);
      expect(init.code, init.out).toBe(0);
    });

    test("the defaults pass every validation and fit Cloud Run (8 vCPU / 32Gi group job)", () => {
      const r = evaluate({});
      expect(r.code, r.out).toBe(0);
      expect(r.locals.job_shape_ok).toEqual({ plan: true, "convert-group": true, finalize: true });
      expect(r.locals.destination_bucket).toBe("ckpts");
      expect(r.locals.destination_matches_template).toBe(true);
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
      ["task_timeout", "1h"],
      ["task_timeout", "604801s"],
      ["max_retries", "11"],
      ["destination_template", "gs://{bucket}/{run}/regular"],
      ["destination_template", "/local/path"],
      ["checkpoint_prefixes", '["gs://ckpts/runs"]'],
      ["checkpoint_prefixes", '["runs,exp"]'],
      ["name_prefix", "This-Is-Not-Valid"],
    ])("validation rejects %s = %s", (name, value) => {
      const r = evaluate({ [name]: value });
      expect(r.code, r.out).not.toBe(0);
      expect(r.out).toContain("Invalid value for variable");
    });

    test("more memory than the CPU count allows is flagged (6 vCPU with 32Gi)", () => {
      const r = evaluate({ group_cpu: "6" });
      expect(r.code, r.out).toBe(0);
      expect(r.locals.job_shape_ok).toEqual({ plan: true, "convert-group": false, finalize: true });
    });

    test("the function's source must be exactly one of a local zip and an uploaded object", () => {
      expect(evaluate({}).locals.function_source_given).toBe(true);
      expect(evaluate({ function_source_zip: "dist/function-source.zip" }).locals.function_source_given).toBe(false);
      expect(evaluate({ function_source_object: undefined }).locals.function_source_given).toBe(false);
      expect(evaluate({ function_source_object: undefined, function_source_zip: "f.zip" }).locals.function_source_given).toBe(true);
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
  });
});
