import { readFileSync } from "node:fs";
import { parse as parseHcl } from "@cdktf/hcl2json";
import { describe, expect, test } from "vitest";
import { parse as parseYaml } from "yaml";
import { failureKey, SUMMARY_KEY } from "../../src/cloud/job-reports.js";

// workflows/convert.yaml against the code around it: what terraform configures, what the jobs read and
// write, and Workflows' own rules. (Its behaviour is tested by running it: test/e2e/pipeline.test.ts.)

const SOURCE = "workflows/convert.yaml";
const text = readFileSync(SOURCE, "utf8");
type Step = Record<string, unknown>;
const workflow = parseYaml(text) as Record<string, { params?: string[]; steps: Step[] }>;

/** Every object in the definition, depth first. */
function* nodes(v: unknown): Generator<Record<string, unknown>> {
  if (Array.isArray(v)) for (const x of v) yield* nodes(x);
  else if (v !== null && typeof v === "object") {
    yield v as Record<string, unknown>;
    for (const x of Object.values(v)) yield* nodes(x);
  }
}
/** A Workflows expression as written in the YAML. */
const expression = (code: string) => `\${${code}}`;
const calls = [...nodes(workflow)].filter((n) => typeof n.call === "string");

describe("workflows/convert.yaml", () => {
  test("takes one argument, as an execution's argument JSON", () => {
    expect(workflow.main?.params).toEqual(["args"]);
  });

  test("fits Workflows' source size limit (128 KB)", () => {
    expect(Buffer.byteLength(text)).toBeLessThan(128 * 1024);
  });

  test("calls only subworkflows it defines, the standard library and the three connectors", () => {
    const connectors = new Set([
      "googleapis.run.v2.projects.locations.jobs.run",
      "googleapis.storage.v1.objects.get",
      "googleapis.pubsub.v1.projects.topics.publish",
    ]);
    for (const { call } of calls) {
      const name = call as string;
      if (name.startsWith("googleapis.")) expect(connectors).toContain(name);
      else if (!name.startsWith("sys.")) expect(Object.keys(workflow)).toContain(name);
    }
  });

  test("reads only the settings terraform gives it", async () => {
    const hcl = await parseHcl("workflow.tf", readFileSync("terraform/modules/orbax2reg/workflow.tf", "utf8"));
    const configured = Object.keys(hcl.resource.google_workflows_workflow.convert[0].user_env_vars);
    const read = [...text.matchAll(/sys\.get_env\("(ORBAX2REG_\w+)"/g)].map((m) => m[1] as string);
    expect(read.length).toBeGreaterThan(5);
    expect(read.filter((name) => !configured.includes(name))).toEqual([]);
  });

  test("passes the jobs only variables the job entry point reads", () => {
    const job = readFileSync("jobs/main.ts", "utf8");
    const passed = [...text.matchAll(/name: (ORBAX2REG_\w+)/g)].map((m) => m[1] as string);
    expect(passed).toContain("ORBAX2REG_GROUP");
    expect(passed.filter((name) => !job.includes(`"${name}"`) && !job.includes(`.${name}`))).toEqual([]);
  });

  test("waits for jobs far longer than the connector's 30-minute default", () => {
    const runs = calls.filter((c) => c.call === "googleapis.run.v2.projects.locations.jobs.run");
    expect(runs).toHaveLength(1); // one place runs every phase
    const args = runs[0]?.args as { connector_params: { timeout: number } };
    expect(args.connector_params.timeout).toBeGreaterThanOrEqual(24 * 3600);
  });

  test("fans out over the groups in parallel with a concurrency limit", () => {
    const parallel = [...nodes(workflow)].find((n) => n.parallel !== undefined)?.parallel as Record<string, unknown>;
    expect(parallel.concurrency_limit).toBe(expression("ctx.concurrency"));
    expect(parallel.shared).toEqual(["failed"]);
    expect((parallel.for as Record<string, unknown>).range).toBe(expression("[0, plan.groups - 1]"));
  });

  test("retries a job only through a predicate that refuses permanent errors", () => {
    const retries = [...nodes(workflow)].filter((n) => n.retry !== undefined).map((n) => n.retry as Record<string, unknown>);
    expect(retries.length).toBeGreaterThan(0);
    for (const r of retries) expect(r.predicate).toBe(expression("retryable"));
    expect(JSON.stringify(workflow.retryable)).toContain('\\"PermanentError\\" in e.tags');
  });

  test("reads the objects the jobs write, where they write them", () => {
    expect(SUMMARY_KEY).toBe(".orbax2reg/summary.json");
    expect(text).toContain('"/.orbax2reg/"');
    expect(text).toContain('ctx.work + "summary.json"');
    expect(failureKey("plan")).toBe(".orbax2reg/failures/plan.json");
    expect(failureKey("convert-group", 3)).toBe(".orbax2reg/failures/group-3.json");
    expect(text).toContain('ctx.work + "failures/" + phase + ".json"');
    expect(text).toContain('ctx.work + "failures/group-" + string(group) + ".json"');
  });
});
