import { Command, CommanderError } from "commander";
import { DEFAULT_DESTINATION_TEMPLATE } from "../defaults.js";
import { classify, EXIT_BAD_INPUT, EXIT_CHECK_FAILED, UNEXPECTED } from "../errors.js";
import { versionLine } from "../version.js";
import { commanderOption, type Flags, type OptionUse } from "./options.js";
import { type Output, processOutput } from "./output.js";

// Each command's module is loaded when that command runs: `convert` never pays for the cloud clients'
// modules, nor `cloud status` for the converter's codecs (Node's start-up is a fair share of a small run).
const convertCommands = () => import("./convert.js");
const cloudFleet = () => import("./cloud-fleet.js");

// Exit codes: 0 success, 4 when verify or cloud check finds a difference, else what the error's class says
// (src/errors.ts: 1, 2 or 3).
export { EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_DESTINATION } from "../errors.js";

const LOCATION = "local path, file:// or gs:// URL";

/**
 * One command, as data: where it sits (`cloud status` is parent "cloud"), its words for --help, its
 * arguments, the options it takes (src/cli/options.ts, in --help's order) and what it runs.
 */
export interface CommandSpec<Uses extends readonly OptionUse[] = readonly OptionUse[]> {
  readonly parent?: "ocdbt" | "cloud";
  readonly name: string;
  /** A few words for the parent's list of commands (long descriptions there do not wrap); --help shows `description`. */
  readonly summary: string;
  readonly description: string;
  /** Required positional arguments: [name, description]. */
  readonly arguments: readonly (readonly [string, string])[];
  readonly options: Uses;
  readonly helpAfter?: string;
  /**
   * Runs the command with the option values commander parsed (typed from the table: Flags) and its positional
   * arguments; resolves to the exit code. A method, so every command fits in COMMANDS whatever its options.
   */
  run(out: Output, options: Flags<Uses>, ...args: string[]): Promise<number>;
}

/** A command with its runner checked against the options it lists. */
const command = <const Uses extends readonly OptionUse[]>(spec: CommandSpec<Uses>): CommandSpec<Uses> => spec;

/** Parent commands: only a description and their subcommands. */
const GROUPS = {
  ocdbt: { summary: "low-level access to one OCDBT database", description: "Low-level access to one OCDBT database." },
  cloud: {
    summary: "work with the pipeline deployed on Google Cloud",
    description: "Work with the pipeline deployed on Google Cloud (terraform/).",
  },
} as const;

const CHECK_HELP =
  "\nSettings come from the flags, then ORBAX2REG_WORKFLOW / ORBAX2REG_PROJECT / ORBAX2REG_REGION / ORBAX2REG_EVENTS_TOPIC,\nthen `terraform output` when run in the terraform folder that deployed the pipeline.\n\nExample (in terraform/examples/basic after terraform apply):\n  orbax2reg cloud check --bucket my-checkpoints --prefix runs";
const SETTINGS_HELP = `\nThe pipeline: --workflow, else --project and --region, else ORBAX2REG_WORKFLOW (or ORBAX2REG_PROJECT and\nORBAX2REG_REGION), else \`terraform output workflow_id\` when run in the terraform folder that deployed it.\nDestinations follow --destination-template, else ORBAX2REG_DESTINATION_TEMPLATE, else terraform output\ndestination_template, else the module's default ${DEFAULT_DESTINATION_TEMPLATE}.`;

/** Where the pipeline is: the options every cloud command but `check` takes after its own. */
const PIPELINE = ["workflow", "project", "region", "destinationTemplate", "json"] as const;
const CHECKPOINT_ROOT = ["checkpoint-root", "gs://BUCKET/PATH holding step_XXXXXXXX directories"] as const;
const PLAN_STEP = { name: "step", description: "the step the plan was made for", required: true } as const;

export const COMMANDS: readonly CommandSpec[] = [
  command({
    name: "inspect",
    summary: "list the arrays of an Orbax step, its layout and commit status",
    description: "List the arrays of an Orbax step (a step directory, a checkpoint root, or a PyTree item), with commit status and layout.",
    arguments: [["location", `a step directory, a checkpoint root or a PyTree item; ${LOCATION}`]],
    options: [
      { name: "json", description: "print one JSON object instead of a table" },
      "checksums",
      "step",
      { name: "progress", description: "with --checksums: show no progress on stderr" },
    ],
    helpAfter:
      "\nExamples:\n  orbax2reg inspect gs://bucket/run/checkpoints/step_00001000\n  orbax2reg inspect ./checkpoints --step 1000 --json --checksums",
    run: async (out, o, location) => (await import("./inspect.js")).runInspect(location, o, out),
  }),
  command({
    name: "convert",
    summary: "convert an Orbax step into an AXLearn regular checkpoint",
    description: "Convert an Orbax step into an AXLearn regular checkpoint at <dest-root>/step_XXXXXXXX (plan, copy, finalize).",
    arguments: [
      ["source", `an Orbax step directory or checkpoint root (latest committed step); ${LOCATION}`],
      ["dest-root", `where step_XXXXXXXX/ is written; ${LOCATION}`],
    ],
    options: [
      "step",
      "paramsOnly",
      "dtype",
      "groups",
      "concurrency",
      "memory",
      "dryRun",
      "force",
      "allowUncommitted",
      { name: "json", description: "print a JSON summary on stdout, and progress as JSON lines on stderr" },
      "progress",
    ],
    helpAfter:
      "\nExamples:\n  orbax2reg convert gs://bucket/run/checkpoints gs://bucket/run/regular\n  orbax2reg convert ./ckpt/step_00001000 ./regular --params-only --json\n  orbax2reg convert ./ckpt/step_00001000 ./serving --params-only --dtype bfloat16",
    run: async (out, o, source, dest) => (await convertCommands()).runConvert(source, dest, o, out),
  }),
  command({
    name: "export-hf",
    summary: "export a fuji model as a Hugging Face Llama checkpoint (safetensors)",
    description:
      "Export the model of an AXLearn fuji step (Orbax or regular) as a Hugging Face LlamaForCausalLM checkpoint: config.json, generation_config.json, model-0000i-of-0000N.safetensors, and model.safetensors.index.json written last. Streamed: memory stays under --memory whatever the model's size.",
    arguments: [
      ["source", `an Orbax or regular step directory, or a checkpoint root (latest committed step); ${LOCATION}`],
      ["dest", `the directory to write the checkpoint into; ${LOCATION}`],
    ],
    options: [
      "step",
      "hfDtype",
      "maxShardSize",
      "hfMemory",
      "fujiVersion",
      "ropeTheta",
      "rmsNormEps",
      "maxPositionEmbeddings",
      "tokenizer",
      { name: "force", description: "replace another export committed at the destination" },
      "begin",
      { name: "taskIndex", description: "with --task-count, after --begin: write this task's shards only (no index)" },
      { name: "taskCount", description: "the number of tasks the shards are shared among (--begin, --task-index)" },
      "finalize",
      {
        name: "json",
        description: "print a JSON summary on stdout (each config value's source too), and progress as JSON lines on stderr",
      },
      "progress",
    ],
    helpAfter:
      "\nA rerun after an interruption keeps the shards already written. On several machines: --begin --task-count N once, then --task-index I --task-count N on each (any order, at once), then --finalize once, all with the same options. The tokenizer files (tokenizer.json, tokenizer_config.json) are written for fuji's own vocabularies, or from --tokenizer; config.json carries AXLearn's bos/eos/pad ids.\n\nExamples:\n  orbax2reg export-hf gs://bucket/run/checkpoints/step_00001000 ./hf\n  orbax2reg export-hf ./ckpt/step_00001000 gs://bucket/hf --fuji-version v3 --max-shard-size 2GB --json",
    run: async (out, o, source, dest) =>
      (await import("./export-hf.js")).runExportHf(
        source,
        dest,
        {
          ...o,
          ...(o.hfDtype === undefined ? {} : { dtype: o.hfDtype }),
          ...(o.hfMemory === undefined ? {} : { memory: o.hfMemory }),
          tokenizer: o.tokenizer === undefined || o.tokenizer === "none" ? o.tokenizer : { file: o.tokenizer },
        },
        out,
      ),
  }),
  command({
    name: "import-hf",
    summary: "import a Hugging Face Llama checkpoint as an AXLearn fuji regular checkpoint",
    description:
      "Import a Hugging Face LlamaForCausalLM checkpoint (config.json and safetensors, sharded or not; float32, bfloat16 or float16) as the model of an AXLearn fuji regular checkpoint at <dest-root>/step_XXXXXXXX, index written last. What fuji cannot represent (biases, rope_scaling, another head_dim or activation) is refused before anything is written. Streamed: memory stays under --memory whatever the model's size.",
    arguments: [
      ["source", `the Hugging Face model folder (config.json, model.safetensors or model.safetensors.index.json); ${LOCATION}`],
      ["dest-root", `the checkpoint root to write step_XXXXXXXX into; ${LOCATION}`],
    ],
    options: [
      { name: "step", description: "the step directory to write: <dest-root>/step_%08d (default 0)" },
      "importDtype",
      "importMemory",
      { name: "force", description: "replace what another import or checkpoint left at that step" },
      { name: "json", description: "print a JSON summary on stdout, and progress as JSON lines on stderr" },
      "progress",
    ],
    helpAfter:
      "\nA rerun after an interruption keeps the chunks already written. The summary names the fuji config and the AXLearn settings that restore it for fine-tuning (docs/cli.md, import-hf).\n\nExamples:\n  orbax2reg import-hf ./Llama-3.2-1B ./ckpt\n  orbax2reg import-hf gs://bucket/hf/llama gs://bucket/run/checkpoints --step 0 --dtype bfloat16 --json",
    run: async (out, o, source, dest) =>
      (await import("./import-hf.js")).runImportHf(
        source,
        dest,
        {
          ...o,
          ...(o.importDtype === undefined ? {} : { dtype: o.importDtype }),
          ...(o.importMemory === undefined ? {} : { memory: o.importMemory }),
        },
        out,
      ),
  }),
  command({
    name: "example",
    summary: "print the path of an example step the package carries",
    description:
      "Print the path of an example step the package carries, to try the commands on: orbax (a small AXLearn-shaped Orbax step, the Quickstart's) or fuji (a tiny fuji v2-shaped model with fuji's 32k vocabulary, saved by AXLearn's OrbaxCheckpointer, for export-hf). Wherever the package is installed (npm's --prefix too).",
    arguments: [["name", "orbax or fuji"]],
    options: [],
    helpAfter: "\nExamples:\n  orbax2reg inspect $(orbax2reg example orbax)\n  orbax2reg export-hf $(orbax2reg example fuji) ./hf",
    run: async (out, _o, name) => {
      const { examplePath } = await import("./example.js");
      out.stdout(examplePath(name));
      return 0;
    },
  }),
  command({
    name: "plan",
    summary: "phase 1 of convert: write the plan",
    description: "Phase 1 of convert: write the plan under <dest-root>/step_XXXXXXXX/.orbax2reg/ and print its groups.",
    arguments: [
      ["source", LOCATION],
      ["dest-root", LOCATION],
    ],
    options: [
      { name: "step", description: "with a checkpoint root: this step" },
      { name: "paramsOnly", description: "keep only model/... leaves and prng_key" },
      "dtype",
      { name: "groups", description: "parameter groups, balanced by bytes" },
      { name: "dryRun", description: "print the plan summary, write nothing" },
      { name: "force", description: "replace a committed or different conversion at the destination" },
      { name: "allowUncommitted", description: "plan a step Orbax never committed" },
      { name: "json", description: "print a JSON summary" },
    ],
    run: async (out, o, source, dest) => (await convertCommands()).runPlan(source, dest, o, out),
  }),
  command({
    name: "convert-group",
    summary: "phase 2 of convert: copy one group of the plan",
    description:
      "Phase 2 of convert: copy one group of the plan. Groups can run at once on different machines; re-running skips what exists.",
    arguments: [["dest-root", LOCATION]],
    options: [
      PLAN_STEP,
      "group",
      "taskIndex",
      "taskCount",
      "concurrency",
      "memory",
      { name: "json", description: "print a JSON report on stdout, and progress as JSON lines on stderr" },
      "progress",
    ],
    run: async (out, o, dest) => (await convertCommands()).runConvertGroup(dest, o, out),
  }),
  command({
    name: "finalize",
    summary: "phase 3 of convert: check every object, write the index last",
    description: "Phase 3 of convert: check every planned object, copy iterator files, write the index last.",
    arguments: [["dest-root", LOCATION]],
    options: [PLAN_STEP, { name: "json", description: "print a JSON report" }],
    run: async (out, o, dest) => (await convertCommands()).runFinalize(dest, o, out),
  }),
  command({
    name: "verify",
    summary: "compare a converted step or a Hugging Face export with its source",
    description:
      "Compare a regular checkpoint with its Orbax source: index, every .zarray, every chunk decoded. Given an export-hf directory (it holds model.safetensors.index.json), compare it with its source (Orbax or regular) tensor by tensor. Prints N passed, M failed; exits 4 on a difference.",
    arguments: [
      ["orbax-step", LOCATION],
      ["regular-step", `the converted step directory (<dest-root>/step_XXXXXXXX); ${LOCATION}`],
    ],
    options: [{ name: "json", description: "print the checks as JSON on stdout, and progress as JSON lines on stderr" }, "progress"],
    run: async (out, o, orbax, regular) => (await convertCommands()).runVerify(orbax, regular, o, out),
  }),
  command({
    parent: "ocdbt",
    name: "ls",
    summary: "list the keys of an OCDBT database",
    description: "List the keys of an OCDBT database (the directory holding manifest.ocdbt) with where each value is stored.",
    arguments: [["db-dir", LOCATION]],
    options: ["keyPrefix", { name: "json", description: 'print a JSON array of {"key","size","inline","file","offset"}' }],
    run: async (out, o, location) => (await import("./ocdbt-ls.js")).runOcdbtLs(location, o, out),
  }),
  command({
    parent: "cloud",
    name: "check",
    summary: "after terraform apply: convert a tiny checkpoint through the pipeline",
    description:
      "After `terraform apply`: upload a tiny Orbax checkpoint under a watched prefix, wait for the pipeline to convert it, verify the result, clean up. With hf_export (terraform output hf_export_destination_template, or ORBAX2REG_EXPORT_DESTINATION_TEMPLATE), also export the bundled fuji example alone through the pipeline and compare it byte for byte with the same export made here.",
    arguments: [],
    options: [
      "bucket",
      "watchedPrefix",
      {
        name: "workflow",
        description: "projects/P/locations/R/workflows/W (default: ORBAX2REG_WORKFLOW, or terraform output workflow_id)",
      },
      "project",
      "region",
      "eventsTopic",
      "timeout",
      "keep",
      { name: "json", description: "print the stages as JSON" },
    ],
    helpAfter: CHECK_HELP,
    run: async (out, o) => (await import("./cloud.js")).runCloudCheck(o, out),
  }),
  command({
    parent: "cloud",
    name: "status",
    summary: "where each step of a checkpoint root stands",
    description: "Where each step of a checkpoint root stands: converted, running, failed, cancelled, claimed or not converted.",
    arguments: [CHECKPOINT_ROOT],
    options: [{ name: "step", description: "only this step" }, "watch", "interval", ...PIPELINE],
    helpAfter: SETTINGS_HELP,
    run: async (out, o, root) => (await cloudFleet()).runCloudStatus(root, o, out),
  }),
  command({
    parent: "cloud",
    name: "start",
    summary: "start one conversion in the pipeline",
    description: "Start one conversion of an Orbax step, claimed as the trigger claims it (refused while one runs).",
    arguments: [["step-dir", "gs://BUCKET/PATH/step_XXXXXXXX"]],
    options: [
      "destination",
      { name: "force", description: "replace a step already converted" },
      { name: "paramsOnly", description: "convert only the model/ leaves and prng_key" },
      "pipelineGroups",
      "exportTo",
      "exportOnly",
      "exportTasks",
      ...PIPELINE,
    ],
    helpAfter: SETTINGS_HELP,
    run: async (out, o, stepDir) => (await cloudFleet()).runCloudStart(stepDir, o, out),
  }),
  command({
    parent: "cloud",
    name: "backfill",
    summary: "start conversions for committed steps not yet converted",
    description: "Start conversions for committed steps that have neither a converted step nor a live claim.",
    arguments: [CHECKPOINT_ROOT],
    options: [
      "from",
      "to",
      "every",
      "maxRunning",
      "poll",
      { name: "dryRun", description: "print what would start, start nothing" },
      "pipelineGroups",
      "exportBackfill",
      "exportSteps",
      ...PIPELINE,
    ],
    helpAfter: SETTINGS_HELP,
    run: async (out, o, root) => (await cloudFleet()).runCloudBackfill(root, o, out),
  }),
  command({
    parent: "cloud",
    name: "cancel",
    summary: "cancel a step's conversion",
    description: "Cancel a step's conversion and its running job executions; no index is written, and a later start resumes.",
    arguments: [CHECKPOINT_ROOT],
    options: [{ name: "step", description: "the step", required: true }, ...PIPELINE],
    helpAfter: SETTINGS_HELP,
    run: async (out, o, root) => (await cloudFleet()).runCloudCancel(root, o, out),
  }),
];

/**
 * A usage error as commander words it ("error: unknown option '--foo'", with "\n(Did you mean --force?)" when
 * it has a guess), as the one line every other error is: "orbax2reg: unknown option '--foo' (see 'orbax2reg
 * convert --help')". The full help is a --help away rather than 40 lines under every typo.
 */
export function usageLine(message: string, command: string): string {
  const problem = message
    .trim()
    .replace(/^error: /, "")
    .replace(/ is invalid\. /, " is invalid: ")
    .replace(/\s*\n\(Did you mean (.*)\?\)$/s, ", did you mean $1?")
    .replace(/\s*\n\s*/g, " ")
    .replace(/\.$/, "");
  return `orbax2reg: ${problem} (see '${command} --help')\n`;
}

/** Commander reports this command's usage errors in one line naming the command's help (usageLine). */
function oneLineErrors(command: Command, path: string): Command {
  return command.configureOutput({ outputError: (message, write) => write(usageLine(message, path)) });
}

const EXIT_CODES_HELP = `
Exit codes: 0 success; 1 unexpected failure (a bug, or a storage fault that outlasted its retries); 2 bad input,
usage or a refusal; 3 the destination cannot be written; ${EXIT_CHECK_FAILED} a check found a difference (verify, cloud check);
141 the reader of the output went away (| head).`;

function buildProgram(out: Output, setExit: (code: number) => void): Command {
  const program = new Command("orbax2reg")
    .description("Read Orbax (OCDBT) checkpoints and convert them to AXLearn regular checkpoints, offline on CPU.")
    .version(versionLine(), "-V, --version", "print the version and the source commit it was built from")
    .showHelpAfterError(false)
    .exitOverride()
    .configureOutput({ writeOut: (s) => out.writeOut(s), writeErr: (s) => out.writeErr(s) })
    .addHelpText("after", EXIT_CODES_HELP);
  oneLineErrors(program, "orbax2reg");
  const parents = new Map<string, Command>();
  const parentOf = (name: keyof typeof GROUPS | undefined): Command => {
    if (name === undefined) return program;
    let parent = parents.get(name);
    if (parent === undefined) {
      parent = oneLineErrors(
        program.command(name).summary(GROUPS[name].summary).description(GROUPS[name].description),
        `orbax2reg ${name}`,
      );
      parents.set(name, parent);
    }
    return parent;
  };
  for (const spec of COMMANDS) {
    const path = ["orbax2reg", spec.parent, spec.name].filter(Boolean).join(" ");
    const command = oneLineErrors(parentOf(spec.parent).command(spec.name).summary(spec.summary).description(spec.description), path);
    for (const [name, description] of spec.arguments) command.argument(`<${name}>`, description);
    for (const use of spec.options) command.addOption(commanderOption(use));
    if (spec.helpAfter !== undefined) command.addHelpText("after", spec.helpAfter);
    // Commander passes the arguments, then the options, then the command.
    command.action(async (...a: unknown[]) => {
      const args = a.slice(0, spec.arguments.length) as string[];
      // Commander built these values from the table's options for this command: what Flags<Uses> describes.
      setExit(await spec.run(out, a[spec.arguments.length] as Flags<readonly OptionUse[]>, ...args));
    });
  }
  return program;
}

/** Runs the CLI; returns the process exit code. Errors are printed as one line on stderr. */
export async function main(argv: string[], out: Output = processOutput()): Promise<number> {
  let code = 0;
  const program = buildProgram(out, (c) => {
    code = c;
  });
  try {
    await program.parseAsync(argv, { from: "user" });
    return code;
  } catch (e) {
    if (e instanceof CommanderError) return e.exitCode === 0 ? 0 : EXIT_BAD_INPUT;
    // One line naming what failed where; only an error nobody expected gets its stack, for the bug report.
    const { kind, exitCode, line } = classify(e);
    out.writeErr(`orbax2reg: ${kind === UNEXPECTED ? `unexpected error: ${(e as Error | undefined)?.stack ?? String(e)}` : line}\n`);
    return exitCode;
  }
}
