import { Command, CommanderError, InvalidArgumentError } from "commander";
import { Orbax2RegError } from "../errors.js";
import { runInspect } from "./inspect.js";
import { runOcdbtLs } from "./ocdbt-ls.js";
import { type Output, processOutput } from "./output.js";

/** Exit codes: 0 success, 1 unexpected failure (a bug or an I/O fault), 2 bad input or usage. */
export const EXIT_BAD_INPUT = 2;

function stepNumber(value: string): number {
  if (!/^\d+$/.test(value)) throw new InvalidArgumentError("must be a non-negative integer");
  return Number(value);
}

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
    .action(async (location: string, opts) => setExit(await runInspect(location, opts, out)));

  const ocdbt = program.command("ocdbt").description("Low-level access to one OCDBT database.");
  ocdbt
    .command("ls")
    .description("List the keys of an OCDBT database (the directory holding manifest.ocdbt) with where each value is stored.")
    .argument("<db-dir>", "local path, file:// or gs:// URL")
    .option("--prefix <p>", "only keys starting with this prefix")
    .option("--json", 'print a JSON array of {"key","size","inline","file","offset"}')
    .action(async (location: string, opts) => setExit(await runOcdbtLs(location, opts, out)));

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
    if (e instanceof Orbax2RegError) {
      out.writeErr(`orbax2reg: ${e.message}\n`);
      return EXIT_BAD_INPUT;
    }
    out.writeErr(`orbax2reg: unexpected error: ${(e as Error).stack ?? String(e)}\n`);
    return 1;
  }
}
