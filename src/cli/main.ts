import { Command, CommanderError, InvalidArgumentError } from "commander";
import { DEFAULT_CONCURRENCY, DEFAULT_MEMORY_MIB } from "../convert/defaults.js";
import { DestinationError, Orbax2RegError, StorageIoError } from "../errors.js";
import { ioCause } from "../store/store.js";
import { type Output, processOutput } from "./output.js";

// Each command's module is loaded when that command runs: `convert` never pays for the cloud clients'
// modules, nor `cloud status` for the converter's codecs (Node's start-up is a fair share of a small run).
const convertCommands = () => import("./convert.js");
const cloudFleet = () => import("./cloud-fleet.js");

/**
 * Exit codes: 0 success, 1 unexpected failure (a bug or an I/O fault), 2 bad input, usage or a refusal
 * (e.g. another conversion holds the destination), 3 the destination cannot be written (not a directory,
 * a directory where a file goes, no permission, read-only, full, no such bucket).
 */
export const EXIT_BAD_INPUT = 2;
export const EXIT_DESTINATION = 3;

function stepNumber(value: string): number {
  if (!/^\d+$/.test(value)) throw new InvalidArgumentError("must be a non-negative integer");
  return Number(value);
}

function positive(value: string): number {
  if (!/^\d+$/.test(value) || Number(value) < 1) throw new InvalidArgumentError("must be a positive integer");
  return Number(value);
}

const LOCATION = "local path, file:// or gs:// URL";

function buildProgram(out: Output, setExit: (code: number) => void): Command {
  const program = new Command("orbax2reg")
    .description("Read Orbax (OCDBT) checkpoints and convert them to AXLearn regular checkpoints, offline on CPU.")
    .version(process.env.npm_package_version ?? "0.1.0")
    .showHelpAfterError()
    .exitOverride()
    .configureOutput({ writeOut: (s) => out.writeOut(s), writeErr: (s) => out.writeErr(s) });

  program
    .command("inspect")
    .description("List the arrays of an Orbax step (a step directory, a checkpoint root, or a PyTree item), with commit status and layout.")
    .argument("<step-dir>", "local path, file:// or gs:// URL")
    .option("--json", "print one JSON object instead of a table")
    .option("--checksums", "decode every array and add the sha256 of its raw little-endian C-order bytes")
    .option("--step <n>", "with a checkpoint root: this step instead of the latest committed one", stepNumber)
    .addHelpText(
      "after",
      "\nExamples:\n  orbax2reg inspect gs://bucket/run/checkpoints/step_00001000\n  orbax2reg inspect ./checkpoints --step 1000 --json --checksums",
    )
    .action(async (location: string, opts) => setExit(await (await import("./inspect.js")).runInspect(location, opts, out)));

  program
    .command("convert")
    .description("Convert an Orbax step into an AXLearn regular checkpoint at <dest-root>/step_XXXXXXXX (plan, copy, finalize).")
    .argument("<source>", `an Orbax step directory or checkpoint root (latest committed step); ${LOCATION}`)
    .argument("<dest-root>", `where step_XXXXXXXX/ is written; ${LOCATION}`)
    .option("--step <n>", "with a checkpoint root: this step instead of the latest committed one", stepNumber)
    .option("--params-only", "keep only model/... leaves (a serving or evaluation export); the index is filtered to match")
    .option("--groups <n>", "parameter groups in the plan (for running groups on several machines)", positive, 1)
    .option("--concurrency <n>", "objects copied at once", positive, DEFAULT_CONCURRENCY)
    .option("--memory <MiB>", "upper bound on buffered bytes", positive, DEFAULT_MEMORY_MIB)
    .option("--dry-run", "plan and print what would be written, write nothing")
    .option("--force", "replace a destination step that is already committed or holds another conversion")
    .option("--allow-uncommitted", "convert a step Orbax never committed (or never merged); the result may be incomplete")
    .option("--json", "print a JSON summary (progress lines go to stderr)")
    .addHelpText(
      "after",
      "\nExamples:\n  orbax2reg convert gs://bucket/run/checkpoints gs://bucket/run/regular\n  orbax2reg convert ./ckpt/step_00001000 ./regular --params-only --json",
    )
    .action(async (source: string, dest: string, opts) => setExit(await (await convertCommands()).runConvert(source, dest, opts, out)));

  program
    .command("plan")
    .description("Phase 1 of convert: write the plan under <dest-root>/step_XXXXXXXX/.orbax2reg/ and print its groups.")
    .argument("<source>", LOCATION)
    .argument("<dest-root>", LOCATION)
    .option("--step <n>", "with a checkpoint root: this step", stepNumber)
    .option("--params-only", "keep only model/... leaves")
    .option("--groups <n>", "parameter groups, balanced by bytes", positive, 1)
    .option("--dry-run", "print the plan summary, write nothing")
    .option("--force", "replace a committed or different conversion at the destination")
    .option("--allow-uncommitted", "plan a step Orbax never committed")
    .option("--json", "print a JSON summary")
    .action(async (source: string, dest: string, opts) => setExit(await (await convertCommands()).runPlan(source, dest, opts, out)));

  program
    .command("convert-group")
    .description(
      "Phase 2 of convert: copy one group of the plan. Groups can run at once on different machines; re-running skips what exists.",
    )
    .argument("<dest-root>", LOCATION)
    .requiredOption("--step <n>", "the step the plan was made for", stepNumber)
    .requiredOption("--group <n>", "group number (0-based)", stepNumber)
    .option("--task-index <n>", "split the group across tasks: this task (default CLOUD_RUN_TASK_INDEX or 0)", stepNumber)
    .option("--task-count <n>", "number of tasks (default CLOUD_RUN_TASK_COUNT or 1)", positive)
    .option("--concurrency <n>", "objects copied at once", positive, DEFAULT_CONCURRENCY)
    .option("--memory <MiB>", "upper bound on buffered bytes", positive, DEFAULT_MEMORY_MIB)
    .option("--json", "print a JSON report")
    .action(async (dest: string, opts) => setExit(await (await convertCommands()).runConvertGroup(dest, opts, out)));

  program
    .command("finalize")
    .description("Phase 3 of convert: check every planned object, copy iterator files, write the index last.")
    .argument("<dest-root>", LOCATION)
    .requiredOption("--step <n>", "the step the plan was made for", stepNumber)
    .option("--json", "print a JSON report")
    .action(async (dest: string, opts) => setExit(await (await convertCommands()).runFinalize(dest, opts, out)));

  program
    .command("verify")
    .description(
      "Compare a regular checkpoint with its Orbax source: index, every .zarray, every chunk decoded. Prints N passed, M failed.",
    )
    .argument("<orbax-step>", LOCATION)
    .argument("<regular-step>", `the converted step directory (<dest-root>/step_XXXXXXXX); ${LOCATION}`)
    .option("--json", "print the checks as JSON")
    .action(async (orbax: string, regular: string, opts) => setExit(await (await convertCommands()).runVerify(orbax, regular, opts, out)));

  const ocdbt = program.command("ocdbt").description("Low-level access to one OCDBT database.");
  ocdbt
    .command("ls")
    .description("List the keys of an OCDBT database (the directory holding manifest.ocdbt) with where each value is stored.")
    .argument("<db-dir>", "local path, file:// or gs:// URL")
    .option("--prefix <p>", "only keys starting with this prefix")
    .option("--json", 'print a JSON array of {"key","size","inline","file","offset"}')
    .action(async (location: string, opts) => setExit(await (await import("./ocdbt-ls.js")).runOcdbtLs(location, opts, out)));

  const cloud = program.command("cloud").description("Work with the pipeline deployed on Google Cloud (terraform/).");
  cloud
    .command("check")
    .description(
      "After `terraform apply`: upload a tiny Orbax checkpoint under a watched prefix, wait for the pipeline to convert it, verify the result, clean up.",
    )
    .requiredOption("--bucket <name>", "the checkpoint bucket the pipeline watches (name only)")
    .option("--prefix <path>", "a watched prefix inside it (one of checkpoint_prefixes)", "")
    .option("--workflow <id>", "projects/P/locations/R/workflows/W (default: ORBAX2REG_WORKFLOW, or terraform output workflow_id)")
    .option("--project <id>", "with --region: the workflow is projects/<id>/locations/<region>/workflows/orbax2reg-convert")
    .option("--region <region>", "the pipeline's region")
    .option("--events-topic <id>", "projects/P/topics/T to wait for the conversion event on (default: terraform output events_topic_id)")
    .option("--timeout <seconds>", "how long the conversion may take", positive, 1800)
    .option("--keep", "keep the uploaded checkpoint and its conversion")
    .option("--json", "print the stages as JSON")
    .addHelpText(
      "after",
      "\nSettings come from the flags, then ORBAX2REG_WORKFLOW / ORBAX2REG_PROJECT / ORBAX2REG_REGION / ORBAX2REG_EVENTS_TOPIC,\nthen `terraform output` when run in the terraform folder that deployed the pipeline.\n\nExample (in terraform/examples/basic after terraform apply):\n  orbax2reg cloud check --bucket my-checkpoints --prefix runs",
    )
    .action(async (opts) => setExit(await (await import("./cloud.js")).runCloudCheck(opts, out)));

  const SETTINGS_HELP =
    "\nThe pipeline: --workflow, else --project and --region, else ORBAX2REG_WORKFLOW (or ORBAX2REG_PROJECT and\nORBAX2REG_REGION), else `terraform output workflow_id` when run in the terraform folder that deployed it.\nDestinations follow --destination-template, else ORBAX2REG_DESTINATION_TEMPLATE, else terraform output\ndestination_template, else the module's default gs://{bucket}/{root}/regular.";
  const pipeline = (c: Command) =>
    c
      .option("--workflow <id>", "projects/P/locations/R/workflows/W")
      .option("--project <id>", "with --region: the workflow is projects/<id>/locations/<region>/workflows/orbax2reg-convert")
      .option("--region <region>", "the pipeline's region")
      .option("--destination-template <t>", "where a step's regular checkpoint goes ({bucket}, {root}, {step})")
      .option("--json", "print JSON")
      .addHelpText("after", SETTINGS_HELP);
  pipeline(
    cloud
      .command("status")
      .description("Where each step of a checkpoint root stands: converted, running, failed, cancelled, claimed or not converted.")
      .argument("<checkpoint-root>", "gs://BUCKET/PATH holding step_XXXXXXXX directories")
      .option("--step <n>", "only this step", stepNumber)
      .option("--watch", "refresh until nothing is running")
      .option("--interval <seconds>", "with --watch: seconds between refreshes", positive, 10),
  ).action(async (root: string, opts) => setExit(await (await cloudFleet()).runCloudStatus(root, opts, out)));
  pipeline(
    cloud
      .command("start")
      .description("Start one conversion of an Orbax step, claimed as the trigger claims it (refused while one runs).")
      .argument("<step-dir>", "gs://BUCKET/PATH/step_XXXXXXXX")
      .option("--destination <root>", "the regular checkpoint root (default: from the destination template)")
      .option("--force", "replace a step already converted")
      .option("--params-only", "convert only the model/ leaves")
      .option("--groups <n>", "parameter groups (default: ORBAX2REG_GROUPS, terraform output groups, else 8)", positive),
  ).action(async (stepDir: string, opts) => setExit(await (await cloudFleet()).runCloudStart(stepDir, opts, out)));
  pipeline(
    cloud
      .command("backfill")
      .description("Start conversions for committed steps that have neither a converted step nor a live claim.")
      .argument("<checkpoint-root>", "gs://BUCKET/PATH holding step_XXXXXXXX directories")
      .option("--from <n>", "first step", stepNumber)
      .option("--to <n>", "last step", stepNumber)
      .option("--every <k>", "only steps divisible by k", positive, 1)
      .option("--max-running <r>", "conversions of this root running at once", positive, 4)
      .option("--poll <seconds>", "while --max-running conversions run, how often to look again", positive, 15)
      .option("--dry-run", "print what would start, start nothing")
      .option("--groups <n>", "parameter groups (default: ORBAX2REG_GROUPS, terraform output groups, else 8)", positive),
  ).action(async (root: string, opts) => setExit(await (await cloudFleet()).runCloudBackfill(root, opts, out)));
  pipeline(
    cloud
      .command("cancel")
      .description("Cancel a step's conversion and its running job executions; no index is written, and a later start resumes.")
      .argument("<checkpoint-root>", "gs://BUCKET/PATH holding step_XXXXXXXX directories")
      .requiredOption("--step <n>", "the step", stepNumber),
  ).action(async (root: string, opts) => setExit(await (await cloudFleet()).runCloudCancel(root, opts, out)));

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
    if (e instanceof DestinationError) {
      out.writeErr(`orbax2reg: ${e.message}\n`);
      return EXIT_DESTINATION;
    }
    if (e instanceof Orbax2RegError) {
      out.writeErr(`orbax2reg: ${e.message}\n`);
      return EXIT_BAD_INPUT;
    }
    if (e instanceof StorageIoError) {
      // Storage kept failing past every retry: one line naming the object and the cause; a re-run resumes.
      out.writeErr(`orbax2reg: ${e.message}\n`);
      return 1;
    }
    // An OS error a store did not translate, that the user fixes at that path: still one line.
    const cause = ioCause(e);
    const path = (e as NodeJS.ErrnoException).path;
    if (cause !== undefined && path !== undefined) {
      out.writeErr(`orbax2reg: ${path}: ${cause}\n`);
      return EXIT_DESTINATION;
    }
    out.writeErr(`orbax2reg: unexpected error: ${(e as Error).stack ?? String(e)}\n`);
    return 1;
  }
}
