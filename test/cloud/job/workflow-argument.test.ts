import { describe, expect, test } from "vitest";
import {
  DEFAULT_EXPORT_TASKS,
  DEFAULT_JOB_TIMEOUT,
  jobEnvironment,
  parseWorkflowArgument,
  parseWorkflowArgumentText,
  stepWorkPrefix,
} from "../../../src/cloud/job/workflow-argument.js";
import { UsageError } from "../../../src/errors.js";

// The argument of a workflows/convert.yaml execution, as the plan job reads it: the rules the workflow used to
// check itself, each mistake a UsageError (permanent: the workflow does not retry it) naming the field.

const SOURCE = "gs://train/runs/exp/checkpoints/step_00001000";
const DESTINATION = "gs://train/runs/exp/regular";
const parse = (extra: Record<string, unknown> = {}, defaultGroups = 8) =>
  parseWorkflowArgument({ source: SOURCE, destination: DESTINATION, ...extra }, defaultGroups);
const refused = (args: unknown) => {
  try {
    parseWorkflowArgument(args, 8);
  } catch (e) {
    expect(e).toBeInstanceOf(UsageError);
    return (e as Error).message;
  }
  throw new Error("accepted");
};
const refusedWith = (extra: Record<string, unknown>) => refused({ source: SOURCE, destination: DESTINATION, ...extra });

describe("the workflow argument", () => {
  test("source and destination alone give the defaults: step from the source, the deployment's groups, 1 task, 7 days", () => {
    expect(parse()).toEqual({
      source: SOURCE,
      destination: DESTINATION,
      step: 1000,
      stepDir: "step_00001000",
      groups: 8,
      tasksPerGroup: 1,
      jobTimeout: 604800,
      paramsOnly: false,
      force: false,
      convert: true,
    });
    expect(DEFAULT_JOB_TIMEOUT).toBe(604800);
  });

  test("no argument at all says what to pass", () => {
    expect(refused(null)).toBe('no argument: pass {"source": "gs://.../step_XXXXXXXX", "destination": "gs://..."}');
  });

  test("a missing source or destination names both fields", () => {
    const message = 'the argument needs "source" (the Orbax step, gs://...) and "destination" (the regular checkpoint root, gs://...)';
    expect(refused({ destination: DESTINATION })).toBe(message);
    expect(refused({ source: SOURCE })).toBe(message);
    expect(refused({ source: SOURCE, destination: null })).toBe(message);
  });

  test("an argument that is not an object is refused like one without the fields", () => {
    expect(refused([SOURCE, DESTINATION])).toMatch(/^the argument needs "source"/);
    expect(refused("gs://b/x")).toMatch(/^the argument needs "source"/);
  });

  test("trailing slashes are removed from source and destination", () => {
    expect(parse({ source: `${SOURCE}//`, destination: `${DESTINATION}/` })).toMatchObject({ source: SOURCE, destination: DESTINATION });
  });

  test("the source must be gs://BUCKET/PATH", () => {
    expect(refusedWith({ source: "gs://train" })).toBe("source must be gs://BUCKET/PATH of an Orbax step, got gs://train");
    expect(refusedWith({ source: "/local/step_1" })).toBe("source must be gs://BUCKET/PATH of an Orbax step, got /local/step_1");
    expect(refusedWith({ source: 7 })).toBe("source must be gs://BUCKET/PATH of an Orbax step, got 7");
  });

  test("the destination must be gs://BUCKET[/PATH]; a bucket alone will do", () => {
    expect(refusedWith({ destination: "s3://x" })).toBe("destination must be gs://BUCKET[/PATH], got s3://x");
    expect(parse({ destination: "gs://regular" }).destination).toBe("gs://regular");
  });

  test("the step comes from the source's last segment, step_N or N", () => {
    expect(parse({ source: "gs://b/run/step_00000042" }).step).toBe(42);
    expect(parse({ source: "gs://b/run/42" }).step).toBe(42);
  });

  test("a source whose last segment is no step asks for step", () => {
    expect(refusedWith({ source: "gs://b/run/latest" })).toBe(
      'cannot tell the step from the source\'s last path segment latest; pass "step"',
    );
  });

  test("an explicit step wins over the source's name, and may be a string of digits", () => {
    expect(parse({ source: "gs://b/run/tensors/latest", step: 100 }).step).toBe(100);
    expect(parse({ step: "0100" })).toMatchObject({ step: 100, stepDir: "step_00000100" });
  });

  test("step 0 is a step", () => {
    expect(parse({ step: 0 }).stepDir).toBe("step_00000000");
  });

  test("the step directory is step_%08d, wider steps unpadded", () => {
    expect(parse({ step: 123456789 }).stepDir).toBe("step_123456789");
  });

  test("whole numbers must be integers or digit strings; the message names the field and shows the value", () => {
    expect(refusedWith({ step: -1 })).toBe("step must be a whole number, got -1");
    expect(refusedWith({ step: 2.5 })).toBe("step must be a whole number, got 2.5");
    expect(refusedWith({ groups: "8a" })).toBe('groups must be a whole number, got "8a"');
    expect(refusedWith({ tasks_per_group: true })).toBe("tasks_per_group must be a whole number, got true");
    expect(refusedWith({ job_timeout: [60] })).toBe("job_timeout must be a whole number, got [60]");
  });

  test("groups default to the deployment's setting, and the argument's wins", () => {
    expect(parse({}, 3).groups).toBe(3);
    expect(parse({ groups: "16" }, 3).groups).toBe(16);
  });

  test("groups, tasks_per_group and job_timeout of 0 would run nothing, and are refused", () => {
    expect(refusedWith({ groups: 0 })).toBe("groups must be at least 1, got 0");
    expect(refusedWith({ tasks_per_group: "0" })).toBe('tasks_per_group must be at least 1, got "0"');
    expect(refusedWith({ job_timeout: 0 })).toBe("job_timeout must be at least 1, got 0");
  });

  test("more than 100 groups or a wait over 7 days are refused: convert.yaml's step budget is worked out for those", () => {
    expect(parse({ groups: 100, job_timeout: 604800 })).toMatchObject({ groups: 100, jobTimeout: 604800 });
    expect(refusedWith({ groups: 101 })).toBe("groups must be at most 100, got 101");
    expect(refusedWith({ job_timeout: "604801" })).toBe('job_timeout must be at most 604800, got "604801"');
  });

  test("tasks_per_group above Cloud Run's 10,000 tasks per job execution is refused at the plan, naming the field", () => {
    expect(parse({ tasks_per_group: 10_000 })).toMatchObject({ tasksPerGroup: 10_000 });
    expect(refusedWith({ tasks_per_group: 10_001 })).toBe("tasks_per_group must be at most 10000, got 10001");
    expect(refusedWith({ tasks_per_group: "20000" })).toBe('tasks_per_group must be at most 10000, got "20000"');
  });

  test("tasks_per_group and job_timeout are taken as given", () => {
    expect(parse({ tasks_per_group: 4, job_timeout: "3600" })).toMatchObject({ tasksPerGroup: 4, jobTimeout: 3600 });
  });

  test("a field given as null counts as absent", () => {
    expect(parse({ step: null, groups: null, tasks_per_group: null, job_timeout: null, options: null })).toEqual(parse());
  });

  test("options.params_only and options.force are booleans, false when absent", () => {
    expect(parse({ options: { params_only: true } })).toMatchObject({ paramsOnly: true, force: false });
    expect(parse({ options: { force: true } })).toMatchObject({ paramsOnly: false, force: true });
    expect(refusedWith({ options: { force: "yes" } })).toBe('options.force must be true or false, got "yes"');
    expect(refusedWith({ options: { params_only: 1 } })).toBe("options.params_only must be true or false, got 1");
  });

  test("options must be an object", () => {
    expect(refusedWith({ options: ["force"] })).toBe('options must be an object, got ["force"]');
  });

  test("as text (the workflow's json.encode_to_string), it must be JSON", () => {
    expect(parseWorkflowArgumentText(JSON.stringify({ source: SOURCE, destination: DESTINATION }), 8).step).toBe(1000);
    expect(() => parseWorkflowArgumentText("{source", 8)).toThrow(UsageError);
    expect(() => parseWorkflowArgumentText("null", 8)).toThrow(/^no argument/);
  });
});

describe("the argument's export", () => {
  const HF = "gs://train/runs/exp/hf/step_00001000";

  test("an export with only its destination gets export-hf's defaults and 8 tasks, and the step is converted too", () => {
    expect(parse({ export: { destination: `${HF}/` } })).toMatchObject({
      convert: true,
      export: { destination: HF, dtype: "bfloat16", tokenizer: undefined, maxShardSize: 5e9, tasks: DEFAULT_EXPORT_TASKS, force: false },
    });
    expect(DEFAULT_EXPORT_TASKS).toBe(8);
  });

  test("convert false with an export asks for the export alone", () => {
    expect(parse({ convert: false, export: { destination: HF } })).toMatchObject({ convert: false, export: { destination: HF } });
  });

  test("convert false without an export is refused: nothing would run", () => {
    expect(refusedWith({ convert: false })).toBe('convert is false and there is no "export": nothing to do');
  });

  test("convert must be a boolean", () => {
    expect(refusedWith({ convert: "no" })).toBe('convert must be true or false, got "no"');
  });

  test("dtype, tokenizer, max_shard_size, tasks and force are taken as given", () => {
    const e = parse({
      export: { destination: HF, dtype: "float32", tokenizer: "gs://t/tok.model", max_shard_size: "2GiB", tasks: "8", force: true },
    }).export;
    expect(e).toEqual({
      destination: HF,
      dtype: "float32",
      tokenizer: { file: "gs://t/tok.model" },
      maxShardSize: 2 ** 31,
      tasks: 8,
      force: true,
    });
    expect(parse({ export: { destination: HF, tokenizer: "none", max_shard_size: 1000 } }).export).toMatchObject({
      tokenizer: "none",
      maxShardSize: 1000,
    });
  });

  test("each mistake names its export field", () => {
    const bad = (e: unknown) => refusedWith({ export: e });
    expect(bad("gs://x/y")).toBe('export must be an object, got "gs://x/y"');
    expect(bad({})).toBe("export.destination must be gs://BUCKET/PATH, the export's own folder, got undefined");
    expect(bad({ destination: "gs://bucket" })).toBe(
      "export.destination must be gs://BUCKET/PATH, the export's own folder, got gs://bucket",
    );
    expect(bad({ destination: HF, dtype: "float16" })).toBe('export.dtype must be bfloat16 or float32, got "float16"');
    expect(bad({ destination: HF, tokenizer: "./tok.model" })).toBe(
      'export.tokenizer must be a gs://BUCKET/PATH file or "none" (absent: the vocabulary\'s own), got "./tok.model"',
    );
    expect(bad({ destination: HF, max_shard_size: "big" })).toBe(
      'export.max_shard_size must be a size such as 5GB, 500MB, 2GiB or a number of bytes, got "big"',
    );
    expect(bad({ destination: HF, max_shard_size: 0 })).toBe("export.max_shard_size must be at least 1 byte, got 0");
    expect(bad({ destination: HF, tasks: 0 })).toBe("export.tasks must be at least 1, got 0");
    expect(bad({ destination: HF, tasks: 10_001 })).toBe("export.tasks must be at most 10000, got 10001");
    expect(bad({ destination: HF, force: "yes" })).toBe('export.force must be true or false, got "yes"');
    expect(bad({ destination: HF, shards: 3 })).toBe(
      "export.shards is not a field of export (destination, dtype, tokenizer, max_shard_size, tasks, force)",
    );
  });

  test("an export destination inside the source is refused", () => {
    expect(refusedWith({ export: { destination: `${SOURCE}/hf` } })).toBe(
      `export.destination ${SOURCE}/hf is inside the source ${SOURCE}: nothing is written into a source`,
    );
  });
});

describe("what the plan job derives for the workflow", () => {
  test("the later jobs' environment is what they read, with the workflow execution's name", () => {
    const execution = "projects/p/locations/us-central1/workflows/orbax2reg-convert/executions/e1";
    expect(jobEnvironment(parse({ groups: 2, options: { force: true } }), execution)).toEqual([
      { name: "ORBAX2REG_SOURCE", value: SOURCE },
      { name: "ORBAX2REG_DESTINATION", value: DESTINATION },
      { name: "ORBAX2REG_STEP", value: "1000" },
      { name: "ORBAX2REG_GROUPS", value: "2" },
      { name: "ORBAX2REG_PARAMS_ONLY", value: "false" },
      { name: "ORBAX2REG_FORCE", value: "true" },
      { name: "ORBAX2REG_EXECUTION", value: execution },
    ]);
  });

  test("without a workflow execution (a plan run by hand) the environment names none", () => {
    expect(jobEnvironment(parse(), undefined).map((v) => v.name)).not.toContain("ORBAX2REG_EXECUTION");
  });

  test("the step's work directory is an object name prefix in the destination's bucket", () => {
    expect(stepWorkPrefix(parse())).toBe("runs/exp/regular/step_00001000/.orbax2reg/");
    expect(stepWorkPrefix(parse({ destination: "gs://regular" }))).toBe("step_00001000/.orbax2reg/");
  });
});
