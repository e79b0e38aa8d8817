// The jobs' write grant (iam.tf's jobs_destination_object_user, whose condition is main.tf's jobs_write_condition)
// as terraform deploys it: the real terraform evaluates the module's locals for each configuration (variables.tf and
// main.tf hold no resource, so no provider is needed), and a real CEL interpreter evaluates the condition on object
// names, as IAM does for `projects/_/buckets/BUCKET/objects/OBJECT`
// (https://cloud.google.com/iam/docs/conditions-resource-attributes#resource-name). Source names are a real Orbax
// step's files placed in several checkpoint roots (and the emergency layout's halves); destination names are what a
// real conversion of that step writes, plus the claim and the workflow's records.
//
// `extract()` is IAM's own function on resource.name (no CEL library has it): it returns the part of the name the
// template's {placeholder} stands for, or "" when the template does not occur
// (https://cloud.google.com/iam/docs/conditions-attribute-reference#resource-name). The module's conditions only
// compare it with "", so which occurrence a name with several would match does not change a verdict.
import { copyFileSync, writeFileSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import { Environment } from "@marcbachmann/cel-js";
import { beforeAll, describe, expect, test } from "vitest";
import { expand } from "../../src/cloud/trigger/classify.js";
import { CLAIM_KEY, PLAN_KEY, runDirKey } from "../../src/convert/work-dir.js";
import { convertWith } from "../helpers/convert.js";
import { filesBelow } from "../helpers/paths.js";
import { applyForOutputs, terraform } from "../helpers/terraform.js";
import { tempDir } from "../helpers/tmp.js";

const MODULE = resolve("terraform/modules/orbax2reg");
const STEP = "test/fixtures/orbax-axlearn/tiny/step_00000100";
const REQUIRED = {
  project_id: "my-project",
  region: "us-central1",
  checkpoint_bucket: "ckpts",
  function_source_bucket: "src-bucket",
  function_source_object: "fn/orbax2reg-0123.zip",
};

/** Checkpoint roots a training bucket may hold: the bucket's top, nested, and names that contain the word "regular". */
const ROOTS = ["", "ckpt", "runs/exp1/checkpoints", "runs/regular-run/ckpts", "a/b/c/d", "runs/exp1/regulars"];

const cel = new Environment()
  .registerVariable("resource", "map")
  .registerFunction("string.extract(string): string", (name: string, template: string) => {
    const open = template.indexOf("{");
    const close = template.indexOf("}", open);
    const before = template.slice(0, open);
    const after = template.slice(close + 1);
    const at = name.indexOf(before);
    if (at < 0) return "";
    const from = at + before.length;
    if (after === "") return name.slice(from);
    const end = name.indexOf(after, from);
    return end < 0 ? "" : name.slice(from, end);
  });

const allows = (condition: string, bucket: string, object: string): boolean =>
  cel.evaluate(condition, { resource: { name: `projects/_/buckets/${bucket}/objects/${object}` } }) === true;

let dir = "";
let stepFiles: string[] = [];
let written: string[] = [];

/** The module's locals for these variables, as the real terraform computes them. */
function locals(vars: Record<string, string>): { form: string; condition: string; destinationBucket: string } {
  const args: string[] = [];
  for (const [k, v] of Object.entries({ ...REQUIRED, ...vars })) args.push("-var", `${k}=${v}`);
  const { code, out, outputs } = applyForOutputs(dir, args);
  expect(code, out).toBe(0);
  return {
    form: String(outputs.jobs_write_form),
    condition: String(outputs.jobs_write_condition),
    destinationBucket: String(outputs.destination_bucket),
  };
}

/** Every object of root's step: the real step's files, and the emergency layout's two halves. */
function sourceObjects(root: string): string[] {
  const at = (p: string) => (root === "" ? p : `${root}/${p}`);
  return [
    ...stepFiles.map((f) => at(`step_00000100/${f}`)),
    ...stepFiles.map((f) => at(`tensors/step_00000100/${f}`)),
    at("non-tensors/step_00000100/index"),
    at("non-tensors/step_00000100/state/_METADATA"),
  ];
}

/** Every object the jobs write for root's step: the real conversion's files, the claim, the workflow's records. */
function destinationObjects(template: string, root: string): { bucket: string; names: string[] } {
  const url = expand(template, { bucket: "ckpts", root, step: "step_00000100" });
  const m = /^gs:\/\/([^/]+)\/?(.*)$/.exec(url);
  const bucket = m?.[1] ?? "";
  const path = m?.[2] ?? "";
  const at = (p: string) => (path === "" ? p : `${path}/${p}`);
  return {
    bucket,
    names: [
      ...written.map(at),
      at(`step_00000100/${CLAIM_KEY}`),
      at(PLAN_KEY),
      at(`${runDirKey("exec-1")}plan.json`),
      at(`${runDirKey("exec-1")}failures/1/report.json`),
    ],
  };
}

beforeAll(async () => {
  dir = tempDir("tf-jobs-access");
  copyFileSync(join(MODULE, "variables.tf"), join(dir, "variables.tf"));
  copyFileSync(join(MODULE, "main.tf"), join(dir, "main.tf"));
  writeFileSync(
    join(dir, "probe.tf"),
    ["jobs_write_form", "jobs_write_condition", "destination_bucket"].map((l) => `output "${l}" {\n  value = local.${l}\n}\n`).join("\n"),
  );
  const init = terraform(["init", "-backend=false", "-input=false", "-no-color"], dir);
  expect(init.code, init.out).toBe(0);
  stepFiles = filesBelow(STEP).map((f) => relative(STEP, f));
  const out = tempDir("jobs-access-out");
  await convertWith(STEP, out);
  written = filesBelow(out).map((f) => relative(out, f));
  expect(written).toContain("step_00000100/index");
});

describe.each([
  ["the defaults: gs://{bucket}/{root}/regular in the checkpoint bucket", {}, "beside-root"],
  ["checkpoint_prefixes = [runs]", { checkpoint_prefixes: '["runs"]' }, "beside-root"],
  ["another directory name: gs://{bucket}/{root}/converted", { destination_template: "gs://{bucket}/{root}/converted" }, "beside-root"],
  [
    "a fixed directory in the checkpoint bucket: gs://{bucket}/regular/{root}",
    { destination_template: "gs://{bucket}/regular/{root}" },
    "prefix",
  ],
  [
    "a separate bucket: gs://regular-out/{root}",
    { destination_bucket: "regular-out", destination_template: "gs://regular-out/{root}" },
    "prefix",
  ],
])("%s", (_label, vars: Record<string, string>, form) => {
  let condition = "";
  let template = "";
  beforeAll(() => {
    const l = locals(vars);
    expect(l.form).toBe(form);
    condition = l.condition;
    template = vars.destination_template ?? "gs://{bucket}/{root}/regular";
  });

  test("the jobs cannot write, overwrite or delete any object under a checkpoint root", () => {
    const writable = ROOTS.flatMap((root) => sourceObjects(root)).filter((o) => allows(condition, "ckpts", o));
    expect(writable).toEqual([]);
  });

  test("the jobs can write every object a conversion, its claim and its workflow's records need", () => {
    for (const root of ROOTS) {
      const d = destinationObjects(template, root);
      expect(
        d.names.filter((o) => !allows(condition, d.bucket, o)),
        `root "${root}"`,
      ).toEqual([]);
    }
  });

  test("nothing in another bucket, and not the bucket itself (listing comes from the read-only grant)", () => {
    expect(allows(condition, "other-bucket", "regular/step_00000100/index")).toBe(false);
    expect(cel.evaluate(condition, { resource: { name: "projects/_/buckets/ckpts" } })).toBe(false);
  });
});

test.each([
  ["gs://{bucket}/{root}", "the destination would be the checkpoint root itself"],
  ["gs://{bucket}/{step}/{root}", "no fixed part tells a destination from a source"],
])("a template no condition can tell from the source is refused (%s: %s)", (destination_template) => {
  const l = locals({ destination_template });
  expect(l.form).toBe("none");
  expect(l.condition).toBe("false");
});
