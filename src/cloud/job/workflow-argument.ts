import { WORK_DIR } from "../../convert/work-dir.js";
import { DEFAULT_EXPORT_TASKS, MAX_GROUPS } from "../../defaults.js";
import { UsageError } from "../../errors.js";
import { DEFAULT_MAX_SHARD_SIZE, parseSize } from "../../hf/shards.js";
import { parseStepName, stepDirName } from "../../orbax/step.js";
import { parseLocation } from "../../store/open.js";
import { joinKey } from "../../store/store.js";

/**
 * The argument of one workflows/convert.yaml execution (what the console, `orbax2reg cloud start` and the
 * trigger function pass), read by the plan job: the workflow itself only checks what it needs before any job
 * runs (a destination bucket to read the plan job's answer from) and hands the rest over verbatim
 * (ORBAX2REG_ARGUMENT). Every mistake is a UsageError naming the field: a retry cannot fix an argument.
 *
 *   {"source": "gs://B/run/checkpoints/step_00001000", "destination": "gs://B/run/regular",
 *    "step": 1000, "groups": 8, "tasks_per_group": 1, "job_timeout": 604800,
 *    "options": {"params_only": false, "force": false},
 *    "convert": true,
 *    "export": {"destination": "gs://B/run/hf/step_00001000", "dtype": "bfloat16", "tokenizer": "gs://B/tok.model",
 *               "max_shard_size": "5GB", "tasks": 4, "force": false}}
 *
 * "export" asks for a Hugging Face export of the step besides (or, with "convert": false, instead of) its
 * conversion; it is always made from the Orbax source, so that it is the same export whether or not the step is
 * converted, and never waits on the regular checkpoint's bytes.
 *
 * Only source and destination are required; a field given as null counts as absent. Whole numbers may be
 * JSON integers or strings of digits (the console makes it easy to type either). CheckedArgument is the
 * argument once checked: every field present, defaults applied, the step directory derived; the JSON as sent
 * is src/cloud/api/executions.ts's WorkflowArgument.
 */
export interface CheckedArgument {
  /** The Orbax step, gs://BUCKET/PATH, trailing slashes removed. */
  readonly source: string;
  /** The regular checkpoint root, gs://BUCKET[/PATH], trailing slashes removed. */
  readonly destination: string;
  readonly step: number;
  /** `step_%08d`, the destination step directory. */
  readonly stepDir: string;
  /** Parameter groups, each converted by its own job execution. */
  readonly groups: number;
  /** Cloud Run tasks splitting each group. */
  readonly tasksPerGroup: number;
  /** Seconds the workflow waits for one job execution before cancelling it. */
  readonly jobTimeout: number;
  readonly paramsOnly: boolean;
  readonly force: boolean;
  /** Whether the step is converted to the regular format (false only with an export: exported alone). */
  readonly convert: boolean;
  /** The Hugging Face export asked for, if any. */
  readonly export?: CheckedExport;
}

/** The argument's "export", checked: what the export phases (src/cloud/job/phases.ts) pass to the engine. */
export interface CheckedExport {
  /** The export's folder, gs://BUCKET/PATH, trailing slashes removed. */
  readonly destination: string;
  readonly dtype: "bfloat16" | "float32";
  /** A gs:// tokenizer file, "none", or undefined: the vocabulary's own (export-hf --tokenizer). */
  readonly tokenizer: { readonly file: string } | "none" | undefined;
  /** Bytes; "5GB"-style strings as export-hf --max-shard-size reads them. */
  readonly maxShardSize: number;
  /** Cloud Run tasks of the export-shards execution (fewer are used when there are fewer shards). */
  readonly tasks: number;
  /** Replaces another committed export in the destination (export-hf --force). */
  readonly force: boolean;
}

export { DEFAULT_EXPORT_TASKS };

/** Seven days: the most Cloud Run lets one task run, and what terraform checks the jobs' retries fit in. */
export const DEFAULT_JOB_TIMEOUT = 604800;

/**
 * The most groups and the longest wait an argument may ask for: terraform's own bound on `groups` (MAX_GROUPS), and the
 * default wait, which no job execution terraform allows outlasts. convert.yaml's step budget
 * (docs/workflows-reference.md, "The step budget") is worked out for these.
 */
export const MAX_JOB_TIMEOUT = DEFAULT_JOB_TIMEOUT;

/**
 * Cloud Run runs at most 10,000 tasks in one job execution (https://cloud.google.com/run/quotas, "Job execution task"):
 * a larger tasks_per_group would pass the plan and fail at the workflow's first jobs.run.
 */
export const MAX_TASKS_PER_GROUP = 10_000;

const USAGE = '{"source": "gs://.../step_XXXXXXXX", "destination": "gs://..."}';

const isMap = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === "object" && !Array.isArray(v);
const given = (m: Record<string, unknown>, field: string): unknown => m[field] ?? undefined;
const shown = (v: unknown) => JSON.stringify(v) ?? String(v);

/** An integer or a string of digits, as a number. */
function wholeNumber(value: unknown, what: string): number {
  const n = typeof value === "number" ? value : typeof value === "string" && /^[0-9]+$/.test(value) ? Number(value) : Number.NaN;
  if (!Number.isSafeInteger(n) || n < 0) throw new UsageError(`${what} must be a whole number, got ${shown(value)}`);
  return n;
}

/** A whole number of which 0 would make nothing run (no group, no task, no wait), and at most `max`. */
function count(value: unknown, what: string, max = Number.MAX_SAFE_INTEGER): number {
  const n = wholeNumber(value, what);
  if (n < 1) throw new UsageError(`${what} must be at least 1, got ${shown(value)}`);
  if (n > max) throw new UsageError(`${what} must be at most ${max}, got ${shown(value)}`);
  return n;
}

function option(options: Record<string, unknown>, name: string): boolean {
  const v = given(options, name);
  if (v === undefined) return false;
  if (typeof v !== "boolean") throw new UsageError(`options.${name} must be true or false, got ${shown(v)}`);
  return v;
}

/**
 * Validates the argument (the execution's argument JSON, already parsed) and fills in the defaults.
 * `defaultGroups` is the deployment's setting (ORBAX2REG_GROUPS on the workflow).
 */
export function parseWorkflowArgument(args: unknown, defaultGroups: number): CheckedArgument {
  if (args === null || args === undefined) throw new UsageError(`no argument: pass ${USAGE}`);
  if (!isMap(args) || given(args, "source") === undefined || given(args, "destination") === undefined)
    throw new UsageError(
      'the argument needs "source" (the Orbax step, gs://...) and "destination" (the regular checkpoint root, gs://...)',
    );
  const trim = (v: unknown) => (typeof v === "string" ? v.replace(/\/+$/, "") : v);
  const source = trim(args.source);
  const destination = trim(args.destination);
  if (typeof source !== "string" || !/^gs:\/\/[^/]+\/./.test(source))
    throw new UsageError(`source must be gs://BUCKET/PATH of an Orbax step, got ${typeof source === "string" ? source : shown(source)}`);
  if (typeof destination !== "string" || !/^gs:\/\/[^/]+/.test(destination))
    throw new UsageError(
      `destination must be gs://BUCKET[/PATH], got ${typeof destination === "string" ? destination : shown(destination)}`,
    );
  const options = given(args, "options") ?? {};
  if (!isMap(options)) throw new UsageError(`options must be an object, got ${shown(options)}`);

  let step = given(args, "step");
  if (step === undefined) {
    // AXLearn names steps step_%08d; a bare number is accepted too.
    const last = source.slice(source.lastIndexOf("/") + 1);
    step = parseStepName(last) ?? (/^[0-9]+$/.test(last) ? last : undefined);
    if (step === undefined) throw new UsageError(`cannot tell the step from the source's last path segment ${last}; pass "step"`);
  }
  const stepNumber = wholeNumber(step, "step");
  const convert = given(args, "convert") ?? true;
  if (typeof convert !== "boolean") throw new UsageError(`convert must be true or false, got ${shown(convert)}`);
  const exported = given(args, "export");
  const checkedExport = exported === undefined ? undefined : parseExport(exported, source);
  if (!convert && checkedExport === undefined) throw new UsageError('convert is false and there is no "export": nothing to do');
  return {
    source,
    destination,
    step: stepNumber,
    stepDir: stepDirName(stepNumber),
    groups: count(given(args, "groups") ?? defaultGroups, "groups", MAX_GROUPS),
    tasksPerGroup: count(given(args, "tasks_per_group") ?? 1, "tasks_per_group", MAX_TASKS_PER_GROUP),
    // The Run connector's own wait (30 minutes) is far too short for a large group; the jobs' task timeout
    // bounds a real run (terraform checks it fits in these 7 days).
    jobTimeout: count(given(args, "job_timeout") ?? DEFAULT_JOB_TIMEOUT, "job_timeout", MAX_JOB_TIMEOUT),
    paramsOnly: option(options, "params_only"),
    force: option(options, "force"),
    convert,
    ...(checkedExport === undefined ? {} : { export: checkedExport }),
  };
}

const DTYPES = ["bfloat16", "float32"] as const;

/** The argument's "export" object; every message names the field as export.NAME. */
function parseExport(value: unknown, source: string): CheckedExport {
  if (!isMap(value)) throw new UsageError(`export must be an object, got ${shown(value)}`);
  const known = ["destination", "dtype", "tokenizer", "max_shard_size", "tasks", "force"];
  const unknown = Object.keys(value).filter((k) => !known.includes(k));
  if (unknown.length > 0) throw new UsageError(`export.${unknown[0]} is not a field of export (${known.join(", ")})`);
  const raw = given(value, "destination");
  const destination = typeof raw === "string" ? raw.replace(/\/+$/, "") : raw;
  if (typeof destination !== "string" || !/^gs:\/\/[^/]+\/./.test(destination))
    throw new UsageError(
      `export.destination must be gs://BUCKET/PATH, the export's own folder, got ${typeof destination === "string" ? destination : shown(destination)}`,
    );
  if (destination === source || destination.startsWith(`${source}/`))
    throw new UsageError(`export.destination ${destination} is inside the source ${source}: nothing is written into a source`);
  const dtype = given(value, "dtype") ?? "bfloat16";
  if (!DTYPES.includes(dtype as (typeof DTYPES)[number]))
    throw new UsageError(`export.dtype must be ${DTYPES.join(" or ")}, got ${shown(dtype)}`);
  const tokenizer = given(value, "tokenizer");
  if (tokenizer !== undefined && tokenizer !== "none" && (typeof tokenizer !== "string" || !/^gs:\/\/[^/]+\/./.test(tokenizer)))
    throw new UsageError(
      `export.tokenizer must be a gs://BUCKET/PATH file or "none" (absent: the vocabulary's own), got ${shown(tokenizer)}`,
    );
  const size = given(value, "max_shard_size") ?? DEFAULT_MAX_SHARD_SIZE;
  let maxShardSize: number;
  try {
    maxShardSize = typeof size === "number" ? wholeNumber(size, "export.max_shard_size") : parseSize(String(size), 1);
    if (typeof size !== "number" && typeof size !== "string") throw new Error("not a size");
  } catch {
    throw new UsageError(`export.max_shard_size must be a size such as 5GB, 500MB, 2GiB or a number of bytes, got ${shown(size)}`);
  }
  if (maxShardSize < 1) throw new UsageError(`export.max_shard_size must be at least 1 byte, got ${shown(size)}`);
  const force = given(value, "force") ?? false;
  if (typeof force !== "boolean") throw new UsageError(`export.force must be true or false, got ${shown(force)}`);
  return {
    destination,
    dtype: dtype as CheckedExport["dtype"],
    tokenizer: tokenizer === undefined ? undefined : tokenizer === "none" ? "none" : { file: tokenizer as string },
    maxShardSize,
    tasks: count(given(value, "tasks") ?? DEFAULT_EXPORT_TASKS, "export.tasks", MAX_TASKS_PER_GROUP),
    force,
  };
}

/** The execution's argument as the workflow passes it to the plan job: JSON text (json.encode_to_string). */
export function parseWorkflowArgumentText(text: string, defaultGroups: number): CheckedArgument {
  let args: unknown;
  try {
    args = JSON.parse(text);
  } catch (e) {
    throw new UsageError(`the argument is not JSON: ${(e as Error).message}`);
  }
  return parseWorkflowArgument(args, defaultGroups);
}

/** One variable of a Cloud Run container override (Run Admin API v2 EnvVar: name, value). */
export interface EnvVar {
  readonly name: string;
  readonly value: string;
}

/**
 * What the convert-group and finalize jobs read (jobs/main.ts), the same for every one of them; the workflow
 * adds ORBAX2REG_GROUP and ORBAX2REG_ATTEMPT. `execution` is the workflow execution's full name, for the
 * logs and `orbax2reg cloud cancel`.
 */
export function jobEnvironment(a: CheckedArgument, execution: string | undefined): EnvVar[] {
  return [
    { name: "ORBAX2REG_SOURCE", value: a.source },
    { name: "ORBAX2REG_DESTINATION", value: a.destination },
    { name: "ORBAX2REG_STEP", value: String(a.step) },
    { name: "ORBAX2REG_GROUPS", value: String(a.groups) },
    { name: "ORBAX2REG_PARAMS_ONLY", value: String(a.paramsOnly) },
    { name: "ORBAX2REG_FORCE", value: String(a.force) },
    ...(execution ? [{ name: "ORBAX2REG_EXECUTION", value: execution }] : []),
  ];
}

/**
 * What the export jobs read besides jobEnvironment's: the export (ORBAX2REG_EXPORT, the argument's "export" as
 * checked, JSON) and the run directory (ORBAX2REG_RUN), where export-begin answers and export-shards reads its task.
 */
export function exportEnvironment(a: CheckedArgument, execution: string | undefined, run: string): EnvVar[] {
  if (a.export === undefined) throw new UsageError("the argument asks for no export");
  const e = a.export;
  const raw = {
    destination: e.destination,
    dtype: e.dtype,
    ...(e.tokenizer === undefined ? {} : { tokenizer: e.tokenizer === "none" ? "none" : e.tokenizer.file }),
    max_shard_size: e.maxShardSize,
    tasks: e.tasks,
    force: e.force,
  };
  return [...jobEnvironment(a, execution), { name: "ORBAX2REG_EXPORT", value: JSON.stringify(raw) }, { name: "ORBAX2REG_RUN", value: run }];
}

/** ORBAX2REG_EXPORT as the export jobs read it: the same checks as the argument's "export". */
export function parseExportText(text: string, source: string): CheckedExport {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new UsageError(`ORBAX2REG_EXPORT is not JSON: ${(e as Error).message}`);
  }
  return parseExport(value, source);
}

/**
 * The step's work directory as an object name prefix in the destination's bucket, ending in "/"
 * (`run/regular/step_00001000/.orbax2reg/`): where the convert-group and finalize jobs leave their failure
 * reports for the workflow to list.
 */
export function stepWorkPrefix(a: CheckedArgument): string {
  const at = parseLocation(a.destination);
  if (at.kind !== "gcs") throw new UsageError(`destination must be gs://BUCKET[/PATH], got ${a.destination}`);
  return `${joinKey(at.prefix, a.stepDir, WORK_DIR)}/`;
}
