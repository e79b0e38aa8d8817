import { readFileSync } from "node:fs";
import { parse as parseHcl } from "@cdktf/hcl2json";
import { describe, expect, test } from "vitest";
import { parse as parseYaml } from "yaml";
import { DEFAULT_JOB_TIMEOUT, jobEnvironment, parseWorkflowArgument, stepWorkPrefix } from "../../src/cloud/job/workflow-argument.js";
import {
  CLAIM_KEY,
  cancelMarkerKey,
  commitPartKey,
  failureKey,
  failuresPrefix,
  groupReportKey,
  PLAN_KEY,
  PROGRESS_PREFIX,
  planPartKey,
  progressKey,
  RECORDS_DIR,
  RUN_ARGUMENT_KEY,
  RUN_EXPORT_KEY,
  RUN_PLAN_KEY,
  recordsDir,
  runDirKey,
  SUMMARY_KEY,
  WORK_DIR,
} from "../../src/convert/work-dir.js";

// workflows/convert.yaml against the code around it: what terraform configures, what the jobs read and
// write, Workflows' own rules, and the documented standard library (docs/workflows-reference.md). Its
// behaviour is tested by running it: test/e2e/pipeline.test.ts and test/workflows/faults.test.ts.

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
/** The code of every `${...}` expression in the definition (braces balanced, string literals respected). */
function* expressions(v: unknown): Generator<string> {
  if (typeof v === "string") {
    for (let i = v.indexOf("${"); i >= 0; i = v.indexOf("${", i)) {
      let depth = 1;
      let j = i + 2;
      let quote: string | undefined;
      for (; j < v.length && depth > 0; j++) {
        const c = v[j] as string;
        if (quote) {
          if (c === "\\") j++;
          else if (c === quote) quote = undefined;
        } else if (c === '"' || c === "'") quote = c;
        else if (c === "{") depth++;
        else if (c === "}") depth--;
      }
      yield v.slice(i + 2, j - 1);
      i = j;
    }
  } else if (Array.isArray(v)) for (const x of v) yield* expressions(x);
  else if (v !== null && typeof v === "object") for (const [k, x] of Object.entries(v)) yield* [...expressions(k), ...expressions(x)];
}
/** Function names called in an expression, string literals removed first (operators like `and (` are not calls). */
const calledIn = (code: string) =>
  [...code.replace(/"(\\.|[^"\\])*"/g, '""').matchAll(/([A-Za-z_][A-Za-z0-9_.]*)\s*\(/g)]
    .map((m) => m[1] as string)
    .filter((f) => !["and", "or", "in"].includes(f));
const reference = readFileSync("docs/workflows-reference.md", "utf8");

describe("workflows/convert.yaml", () => {
  test("takes one argument, as an execution's argument JSON", () => {
    expect(workflow.main?.params).toEqual(["args"]);
  });

  test("fits Workflows' source size limit (128 KB)", () => {
    expect(Buffer.byteLength(text)).toBeLessThan(128 * 1024);
  });

  test("calls only subworkflows it defines, sys.log / sys.sleep and the connectors docs/workflows-reference.md lists", () => {
    const connectors = new Set([
      "googleapis.run.v2.projects.locations.jobs.run",
      "googleapis.run.v2.projects.locations.operations.get",
      "googleapis.run.v2.projects.locations.jobs.executions.cancel",
      "googleapis.storage.v1.objects.get",
      "googleapis.storage.v1.objects.list",
      "googleapis.pubsub.v1.projects.topics.publish",
    ]);
    for (const { call } of calls) {
      const name = call as string;
      if (name.startsWith("googleapis.")) expect(connectors).toContain(name);
      else if (name.startsWith("sys.")) expect(["sys.log", "sys.sleep"]).toContain(name);
      else expect(Object.keys(workflow)).toContain(name);
      if (!Object.keys(workflow).includes(name)) expect(reference).toContain(`\`${name}\``);
    }
  });

  test("uses in expressions only standard-library functions docs/workflows-reference.md documents", () => {
    const documented = new Set([
      "default",
      "int",
      "keys",
      "len",
      "not",
      "string",
      "base64.encode",
      "json.decode",
      "json.encode",
      "json.encode_to_string",
      "list.concat",
      "map.get",
      "map.merge",
      "math.max",
      "math.min",
      "sys.get_env",
      "sys.now",
      "text.match_regex",
      "text.replace_all_regex",
      "text.split",
      "text.url_encode",
      "time.format",
      "uuid.generate",
    ]);
    const used = new Set([...expressions(workflow)].flatMap(calledIn));
    expect([...used].filter((f) => !documented.has(f))).toEqual([]);
    for (const f of used) if (f !== "not") expect(reference).toContain(`\`${f}(`);
    // get_type() is not on Google's expression-helpers page as stored here: decide types without it.
    expect(used.has("get_type")).toBe(false);
  });

  test("reads only the settings terraform gives it", async () => {
    const hcl = await parseHcl("workflow.tf", readFileSync("terraform/modules/orbax2reg/workflow.tf", "utf8"));
    const configured = Object.keys(hcl.resource.google_workflows_workflow.convert[0].user_env_vars);
    const read = [...text.matchAll(/sys\.get_env\("(ORBAX2REG_\w+)"/g)].map((m) => m[1] as string);
    expect(read.length).toBeGreaterThan(5);
    expect(read.filter((name) => !configured.includes(name))).toEqual([]);
  });

  test("passes the jobs only variables the job entry point reads", () => {
    const job = ["jobs/main.ts", "src/cloud/job/phases.ts"].map((f) => readFileSync(f, "utf8")).join("\n");
    const passed = [...text.matchAll(/name: (ORBAX2REG_\w+)/g)].map((m) => m[1] as string);
    expect(passed).toEqual(expect.arrayContaining(["ORBAX2REG_ARGUMENT", "ORBAX2REG_RUN", "ORBAX2REG_GROUP", "ORBAX2REG_ATTEMPT"]));
    // The later jobs' environment comes from the plan job's plan.json (jobEnv), built by jobEnvironment.
    const argument = parseWorkflowArgument({ source: "gs://b/run/step_00000100", destination: "gs://b/regular" }, 8);
    const planned = jobEnvironment(argument, "projects/p/locations/l/workflows/w/executions/e").map((v) => v.name);
    expect(text).toContain("plan.jobEnv");
    expect([...passed, ...planned].filter((name) => !job.includes(`"${name}"`) && !job.includes(`.${name}`))).toEqual([]);
  });

  test("starts jobs without waiting in the connector, then polls, and cancels what it stops waiting for", () => {
    const runs = calls.filter((c) => c.call === "googleapis.run.v2.projects.locations.jobs.run");
    expect(runs).toHaveLength(1); // one place runs every phase
    const args = runs[0]?.args as { connector_params: Record<string, unknown> };
    expect(args.connector_params).toEqual({ skip_polling: true });
    expect(calls.filter((c) => c.call === "googleapis.run.v2.projects.locations.operations.get").length).toBeGreaterThan(0);
    expect(calls.filter((c) => c.call === "googleapis.run.v2.projects.locations.jobs.executions.cancel")).toHaveLength(1);
    // The default wait is far longer than the connector's 30 minutes: the deployment's ORBAX2REG_JOB_TIMEOUT (what
    // its jobs may take), else 7 days, what terraform checks the jobs fit in. The plan job is waited for that long
    // (the argument is not read yet); the others as long as the plan job read from the argument.
    expect(DEFAULT_JOB_TIMEOUT).toBe(604800);
    expect(text).toContain(`plan_wait: ${expression('int(sys.get_env("ORBAX2REG_JOB_TIMEOUT", "604800"))')}`);
    expect(text).toContain(`max_wait: ${expression("ctx.plan_wait")}`);
    expect(text.match(/max_wait: \$\{plan\.jobTimeout\}/g)).toHaveLength(2);
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
    expect(JSON.stringify(workflow.retryable)).toContain('\\"PermanentError\\" in tags');
  });

  test("reads the objects the jobs write, where they write them", () => {
    // The plan job answers in this execution's run directory (the workflow does not know the step before).
    expect(runDirKey("e1")).toBe(".orbax2reg/executions/e1/");
    expect(text).toContain('prefix + ".orbax2reg/executions/" + execution_id + "/"');
    expect(text).toContain('sys.get_env("GOOGLE_CLOUD_WORKFLOW_EXECUTION_ID")');
    expect(text).toContain(`ctx.run + "${RUN_PLAN_KEY}"`);
    expect(text).toContain(`ctx.run + "${RUN_ARGUMENT_KEY}"`);
    expect(text).toContain(expression('"gs://" + ctx.bucket + "/" + ctx.run'));
    // The step's summary stays where `orbax2reg cloud status` reads it; plan.json names the step's work directory.
    expect(SUMMARY_KEY).toBe(".orbax2reg/summary.json");
    const argument = parseWorkflowArgument({ source: "gs://b/run/step_00000100", destination: "gs://b/x/regular" }, 8);
    expect(stepWorkPrefix(argument)).toBe("x/regular/step_00000100/.orbax2reg/");
    // Failure reports: one prefix per job execution (the workflow's attempt id), the verdict first in the name;
    // the plan job's in the run directory, the others' in the step's work directory.
    expect(failuresPrefix("a1")).toBe(".orbax2reg/failures/a1/");
    expect(failuresPrefix("a1", "")).toBe("failures/a1/");
    expect(failureKey("a1", { permanent: true, task: 2, taskAttempt: 1 })).toBe(".orbax2reg/failures/a1/permanent.task-2.attempt-1.json");
    expect(failureKey("a1", { permanent: false, task: 0, taskAttempt: 0 })).toBe(".orbax2reg/failures/a1/transient.task-0.attempt-0.json");
    expect(text).toContain(expression('ctx.run + "failures/"'));
    expect(text.match(/failures: \$\{plan\.work \+ "failures\/"\}/g)).toHaveLength(2);
    expect(text).toContain('failures + attempt + "/"');
    expect(text).toContain('reports + "permanent."');
    expect(text).toContain("name: ORBAX2REG_ATTEMPT");
    expect(text).toContain(expression("uuid.generate()"));
  });
});

describe("workflows/convert.yaml's work-directory keys", () => {
  // The workflow builds keys of the work directory itself (the storage connector reads and lists them): each
  // piece it spells must be a piece of a key src/convert/work-dir.ts makes, cut at a path boundary or an id.
  const ID = "ID0SENTINEL";
  const keys = [
    `${WORK_DIR}/`,
    PLAN_KEY,
    planPartKey(ID, 0, 0),
    commitPartKey(ID),
    `${RECORDS_DIR}/`,
    `${recordsDir(ID, { group: 0, part: 0 })}/`,
    groupReportKey(0, 0, 2),
    CLAIM_KEY,
    SUMMARY_KEY,
    PROGRESS_PREFIX,
    progressKey("convert-group", 0, 0),
    progressKey("finalize", null, 0),
    cancelMarkerKey(ID),
    `${runDirKey(ID)}${RUN_PLAN_KEY}`,
    `${runDirKey(ID)}${RUN_ARGUMENT_KEY}`,
    `${runDirKey(ID)}${RUN_EXPORT_KEY}`,
    ...[WORK_DIR, ""].flatMap((under) => [
      failuresPrefix(ID, under),
      ...[true, false].map((permanent) => failureKey(ID, { permanent, task: 0, taskAttempt: 0 }, under)),
    ]),
  ];
  /** `piece` occurs in `key` starting at a key, path or id boundary and ending at one (or after "/" or "."). */
  const isPieceOf = (piece: string, key: string) => {
    for (let i = key.indexOf(piece); i >= 0; i = key.indexOf(piece, i + 1)) {
      const end = i + piece.length;
      const starts = i === 0 || key[i - 1] === "/" || key.slice(0, i).endsWith(ID);
      const ends = end === key.length || /[/.]$/.test(piece) || key.startsWith(ID, end);
      if (starts && ends) return true;
    }
    return false;
  };
  /** A string literal that spells part of a work-directory key. */
  const WORK_PIECE = /\.orbax2reg|^(?:failures|executions|progress|cancelled|records|plans|groups)\/|\.json$|^(?:permanent|transient)\./;
  /** The workflow's variables that hold a work-directory key: whatever it appends to them is a piece of one. */
  const AFTER_WORK_KEY = /\b(?:ctx\.run|plan\.work|failures|reports)\s*\+\s*"((?:\\.|[^"\\])*)"/g;
  const codes = [...expressions(workflow)];
  const literals = codes.flatMap((code) => [...code.matchAll(/"((?:\\.|[^"\\])*)"/g)].map((m) => m[1] as string));
  const appended = codes.flatMap((code) => [...code.matchAll(AFTER_WORK_KEY)].map((m) => m[1] as string));
  const pieces = [...new Set([...literals.filter((l) => WORK_PIECE.test(l)), ...appended])];

  test("are found: the run directory, its plan and argument, failure reports and their verdict", () => {
    expect(pieces).toEqual(expect.arrayContaining([".orbax2reg/executions/", RUN_PLAN_KEY, RUN_ARGUMENT_KEY, "failures/", "permanent."]));
  });

  test.each(pieces)("%s is spelled as src/convert/work-dir.ts spells it", (piece) => {
    expect(keys.filter((k) => isPieceOf(piece, k))).not.toEqual([]);
  });

  test("a misspelled piece is not taken for one", () => {
    for (const wrong of [".orbax2reg/execution/", "failure/", "permanant.", "plans.json"]) {
      expect(keys.some((k) => isPieceOf(wrong, k))).toBe(false);
    }
  });
});
