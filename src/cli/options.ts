import { InvalidArgumentError, Option } from "commander";
import { DEFAULT_CONCURRENCY, DEFAULT_GROUPS, DEFAULT_MEMORY_MIB, DEFAULT_PLAN_GROUPS, DEFAULT_WORKFLOW_NAME } from "../defaults.js";
import { memorySize, shardSize } from "../hf/shards.js";

/**
 * Every option of every command, declared once: its flags, what it means, how its text is parsed and its
 * default (which --help shows). A command lists the options it takes (src/cli/main.ts); where an option
 * means something narrower there, the command says so in its own words (OptionUse), but the flags, parser
 * and default stay the table's. Commander turns `--task-index` into the attribute `taskIndex`; the table's
 * names are those attributes, except where two options share a flag (prefix, groups).
 * A module of its own that loads no engine code: `orbax2reg --version` stays fast.
 */

/** A step, a group or a task index: 0, 1, 2, ... */
export function wholeNumber(value: string): number {
  if (!/^\d+$/.test(value)) throw new InvalidArgumentError("must be a non-negative integer");
  return Number(value);
}

/** An element type an export can be cast to. */
export function castDtype(value: string): "bfloat16" {
  if (value !== "bfloat16") throw new InvalidArgumentError("must be bfloat16 (the only dtype an export is cast to)");
  return value;
}

/** The dtype of an export-hf's tensors. */
export function hfDtype(value: string): "bfloat16" | "float32" {
  if (value !== "bfloat16" && value !== "float32") throw new InvalidArgumentError("must be bfloat16 or float32");
  return value;
}

/** A fuji version: v1, v2 or v3. */
export function fujiVersion(value: string): "v1" | "v2" | "v3" {
  if (value !== "v1" && value !== "v2" && value !== "v3") throw new InvalidArgumentError("must be v1, v2 or v3");
  return value;
}

/** A positive finite number (1e4, 0.00001). */
export function positiveNumber(value: string): number {
  const n = Number(value);
  if (value.trim() === "" || !Number.isFinite(n) || n <= 0) throw new InvalidArgumentError("must be a positive number");
  return n;
}

/** A count or a duration: 1, 2, 3, ... */
export function positive(value: string): number {
  if (!/^\d+$/.test(value) || Number(value) < 1) throw new InvalidArgumentError("must be a positive integer");
  return Number(value);
}

export interface OptionSpec {
  /** Commander's flags: `--name` for a switch, `--name <value>` for a value. */
  readonly flags: string;
  readonly description: string;
  /** Turns the text into the value; throws InvalidArgumentError. Absent: the text itself. */
  readonly parse?: (value: string) => number | string;
  /** The value when the flag is absent; shown by --help. Absent: no default (or one the command resolves). */
  readonly default?: number | string;
  /** The command refuses to run without it. */
  readonly required?: boolean;
}

const WORKFLOW_ID = "projects/P/locations/R/workflows/W";

export const OPTIONS = {
  // Output
  json: { flags: "--json", description: "print JSON" },
  // Commander names a `--no-x` switch's attribute `x`: true unless the flag is given.
  progress: {
    flags: "--no-progress",
    description: "show no progress on stderr (otherwise: a bar on a terminal, JSON lines with --json, else a line every 30 s)",
  },
  // Which step
  step: { flags: "--step <n>", description: "with a checkpoint root: this step instead of the latest committed one", parse: wholeNumber },
  // What a conversion does
  paramsOnly: {
    flags: "--params-only",
    description:
      "keep only model/... leaves and prng_key (a serving export: what AXLearn's InferenceRunner restores); the index is filtered to match",
  },
  dtype: {
    flags: "--dtype <dtype>",
    description:
      "write every float32/float64 leaf as this dtype (bfloat16: rounded to nearest even, as jnp's astype does); integer and 16-bit leaves are copied as they are",
    parse: castDtype,
  },
  groups: {
    flags: "--groups <n>",
    description: "parameter groups in the plan (for running groups on several machines)",
    parse: positive,
    default: DEFAULT_PLAN_GROUPS,
  },
  dryRun: { flags: "--dry-run", description: "plan and print what would be written, write nothing" },
  force: { flags: "--force", description: "replace a destination step that is already committed or holds another conversion" },
  allowUncommitted: {
    flags: "--allow-uncommitted",
    description: "convert a step Orbax never committed (or never merged); the result may be incomplete",
  },
  // How a conversion copies
  concurrency: { flags: "--concurrency <n>", description: "objects copied at once", parse: positive, default: DEFAULT_CONCURRENCY },
  memory: { flags: "--memory <MiB>", description: "upper bound on buffered bytes", parse: positive, default: DEFAULT_MEMORY_MIB },
  group: { flags: "--group <n>", description: "group number (0-based)", parse: wholeNumber, required: true },
  // Not commander defaults: the CLI reads Cloud Run's task variables only when a flag is left out (convert.ts).
  taskIndex: {
    flags: "--task-index <n>",
    description: "split the group across tasks: this task (default CLOUD_RUN_TASK_INDEX or 0)",
    parse: wholeNumber,
  },
  taskCount: { flags: "--task-count <n>", description: "number of tasks (default CLOUD_RUN_TASK_COUNT or 1)", parse: positive },
  // export-hf
  hfDtype: {
    flags: "--dtype <dtype>",
    description: "bfloat16 (rounded to nearest even, as torch casts) or float32",
    parse: hfDtype,
    default: "bfloat16",
  },
  maxShardSize: {
    flags: "--max-shard-size <size>",
    description: "largest shard, as transformers counts it (default 5GB = 5*10^9 bytes; KB/MB/GB, KiB/MiB/GiB, or bytes)",
    parse: shardSize,
  },
  hfMemory: {
    flags: "--memory <size>",
    description:
      "upper bound on chunk decoders and output tensors held at once (default 336MiB; MiB, or a size such as 1GiB); a larger tensor is made in bands",
    parse: memorySize,
  },
  // import-hf
  importDtype: {
    flags: "--dtype <dtype>",
    description:
      "float32 (AXLearn keeps fuji's parameters in float32: common.py's model config dtype) or bfloat16 (rounded to nearest even, as jnp's astype)",
    parse: hfDtype,
    default: "float32",
  },
  importMemory: {
    flags: "--memory <size>",
    description:
      "upper bound on the chunks made at once: their source bytes, the chunk and its compressed bytes (default 256MiB; MiB, or a size such as 1GiB)",
    parse: memorySize,
  },
  fujiVersion: {
    flags: "--fuji-version <v>",
    description: "v1, v2 or v3: the defaults below (default: from the vocabulary and QKV kind)",
    parse: fujiVersion,
  },
  ropeTheta: {
    flags: "--rope-theta <x>",
    description: "config rope_theta (default: the fuji version's, 1e4 for v1/v2, 5e5 for v3)",
    parse: positiveNumber,
  },
  rmsNormEps: { flags: "--rms-norm-eps <x>", description: "config rms_norm_eps (default: fuji's 1e-5)", parse: positiveNumber },
  maxPositionEmbeddings: {
    flags: "--max-position-embeddings <n>",
    description: "config max_position_embeddings (default: the fuji version's sequence length, 2048/4096/8192)",
    parse: positive,
  },
  tokenizer: {
    flags: "--tokenizer <file>",
    description:
      "the export's tokenizer: a sentencepiece .model or a tokenizer.json (local or gs://), or none (default: AXLearn's vocabulary for fuji's 32k and 128k embeddings)",
  },
  begin: {
    flags: "--begin",
    description: "with --task-count: check the destination, write the record, print each task's shards; no shard written",
  },
  finalize: { flags: "--finalize", description: "check every shard is in place, then write the small files and the index last" },
  // inspect, ocdbt ls
  checksums: { flags: "--checksums", description: "decode every array and add the sha256 of its raw little-endian C-order bytes" },
  keyPrefix: { flags: "--prefix <p>", description: "only keys starting with this prefix" },
  // Where the pipeline is (cloud commands; src/cloud/ops/settings.ts resolves what is left out)
  workflow: { flags: "--workflow <id>", description: WORKFLOW_ID },
  project: {
    flags: "--project <id>",
    description: `with --region: the workflow is projects/<id>/locations/<region>/workflows/${DEFAULT_WORKFLOW_NAME}`,
  },
  region: { flags: "--region <region>", description: "the pipeline's region" },
  destinationTemplate: {
    flags: "--destination-template <t>",
    description: "where a step's regular checkpoint goes ({bucket}, {root}, {step})",
  },
  eventsTopic: {
    flags: "--events-topic <id>",
    description: "projects/P/topics/T to wait for the conversion event on (default: terraform output events_topic_id)",
  },
  pipelineGroups: {
    flags: "--groups <n>",
    description: `parameter groups (default: ORBAX2REG_GROUPS, terraform output groups, else ${DEFAULT_GROUPS})`,
    parse: positive,
  },
  // cloud check
  bucket: { flags: "--bucket <name>", description: "the checkpoint bucket the pipeline watches (name only)", required: true },
  watchedPrefix: { flags: "--prefix <path>", description: "a watched prefix inside it (one of checkpoint_prefixes)", default: "" },
  timeout: { flags: "--timeout <seconds>", description: "how long the conversion may take", parse: positive, default: 1800 },
  keep: { flags: "--keep", description: "keep the uploaded checkpoint and its conversion" },
  // cloud status, start, backfill
  watch: { flags: "--watch", description: "refresh until nothing is running" },
  interval: { flags: "--interval <seconds>", description: "with --watch: seconds between refreshes", parse: positive, default: 10 },
  destination: { flags: "--destination <root>", description: "the regular checkpoint root (default: from the destination template)" },
  // cloud start: the workflow argument's export (src/cloud/job/workflow-argument.ts)
  exportTo: { flags: "--export <folder>", description: "also export the step as a Hugging Face checkpoint into this gs:// folder" },
  exportOnly: {
    flags: "--export-only",
    description: "with --export: export the step straight from its Orbax source, without converting it",
  },
  exportTasks: { flags: "--export-tasks <n>", description: "Cloud Run tasks writing the export's shards (default 4)", parse: positive },
  // cloud backfill --export: the deployment's hf_export rule, from the function's ORBAX2REG_EXPORT_* variables
  exportBackfill: {
    flags: "--export",
    description: "start Hugging Face exports (export only) of the steps hf_export asks for that have none, instead of conversions",
  },
  exportSteps: {
    flags: "--export-steps <list>",
    description: "with --export: these steps (comma-separated) instead of the ones hf_export asks for",
  },
  from: { flags: "--from <n>", description: "first step", parse: wholeNumber },
  to: { flags: "--to <n>", description: "last step", parse: wholeNumber },
  every: { flags: "--every <k>", description: "only steps divisible by k", parse: positive, default: 1 },
  maxRunning: { flags: "--max-running <r>", description: "conversions of this root running at once", parse: positive, default: 4 },
  poll: {
    flags: "--poll <seconds>",
    description: "while --max-running conversions run, how often to look again",
    parse: positive,
    default: 15,
  },
} as const satisfies Record<string, OptionSpec>;

export type OptionName = keyof typeof OPTIONS;

/** A command's use of an option: its name, or its name and what the option means for this command. */
export type OptionUse = OptionName | { readonly name: OptionName; readonly description?: string; readonly required?: boolean };

type Spec<N extends OptionName> = (typeof OPTIONS)[N];
type NameOf<U> = U extends OptionName ? U : U extends { readonly name: infer N extends OptionName } ? N : never;
/** The value commander hands over: the parser's result, the text of a `<value>` flag, or true for a switch. */
type ValueOf<N extends OptionName> =
  Spec<N> extends { readonly parse: (v: string) => infer T }
    ? T
    : Spec<N> extends { readonly flags: `${string}<${string}>` }
      ? string
      : boolean;
/** The names a command always receives a value for: the option has a default, or the table or the use requires it. */
type Given<U> = U extends OptionName
  ? Spec<U> extends { readonly default: unknown } | { readonly required: true }
    ? U
    : never
  : U extends { readonly required: true }
    ? NameOf<U>
    : GivenName<NameOf<U>>;
type GivenName<N extends OptionName> = N extends OptionName
  ? Spec<N> extends { readonly default: unknown } | { readonly required: true }
    ? N
    : never
  : never;

/**
 * The option values a command's runner receives for the options it lists, typed from the table: what commander
 * parses is what the runner is declared to take, so a command's flags cannot drift from OPTIONS.
 */
export type Flags<Uses extends readonly OptionUse[]> = {
  readonly [N in Given<Uses[number]>]: ValueOf<N>;
} & {
  readonly [N in Exclude<NameOf<Uses[number]>, Given<Uses[number]>>]?: ValueOf<N>;
};

/** The option as a command uses it: the table's flags, parser and default, the command's words. */
export function optionSpec(use: OptionUse): OptionSpec {
  if (typeof use === "string") return OPTIONS[use];
  const { name, ...narrower } = use;
  return { ...OPTIONS[name], ...narrower };
}

/** The commander Option for one use. */
export function commanderOption(use: OptionUse): Option {
  const spec = optionSpec(use);
  const option = new Option(spec.flags, spec.description);
  if (spec.parse) option.argParser(spec.parse);
  if (spec.default !== undefined) option.default(spec.default);
  if (spec.required) option.makeOptionMandatory();
  return option;
}
