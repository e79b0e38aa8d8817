// A mistyped command line is one line on stderr, like every other error: what is wrong, and which --help
// to read; exit 2. Never the help itself (40 lines that push the problem off the screen).
import { describe, expect, test } from "vitest";
import { COMMANDS } from "../../src/cli/main.js";
import { optionSpec } from "../../src/cli/options.js";
import { runBin, runCli } from "../helpers/cli.js";

const TINY = "test/fixtures/orbax-axlearn/tiny/step_00000100";
const words = (c: (typeof COMMANDS)[number]) => [...(c.parent ? [c.parent] : []), c.name];
const named = COMMANDS.map((c) => [words(c).join(" "), c] as const);
/** The command with its arguments and required options, all given: what is left to go wrong is the rest. */
const complete = (c: (typeof COMMANDS)[number]) => [
  ...words(c),
  ...c.arguments.map(() => "x"),
  ...c.options.map(optionSpec).flatMap((o) => (o.required ? [o.flags.split(" ")[0] as string, "1"] : [])),
];

describe("a usage error", () => {
  test.each(named)("%s: an unknown option is one line naming it and the command's --help, exit 2", async (name, command) => {
    const r = await runCli([...complete(command), "--xyzzy"]);
    expect(r.code).toBe(2);
    expect(r.stdout).toBe("");
    expect(r.stderr).toBe(`orbax2reg: unknown option '--xyzzy' (see 'orbax2reg ${name} --help')\n`);
  });

  test.each(named)("%s: nothing after the command is one line naming what is missing, exit 2", async (name, command) => {
    const r = await runCli(words(command));
    expect(r.code).toBe(2);
    expect(r.stdout).toBe("");
    // Commander checks required options before arguments: whichever it finds missing first.
    expect(r.stderr).toMatch(
      new RegExp(
        `^orbax2reg: (missing required argument '[a-z-]+'|required option '--[a-z-]+ <[a-z]+>' not specified) \\(see 'orbax2reg ${name} --help'\\)\n$`,
      ),
    );
  });

  test("a missing required option is one line naming it", async () => {
    const r = await runCli(["finalize", "/tmp/regular"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe("orbax2reg: required option '--step <n>' not specified (see 'orbax2reg finalize --help')\n");
  });

  test("a value the option refuses is one line saying what it must be", async () => {
    const r = await runCli(["inspect", TINY, "--step", "x"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe(
      "orbax2reg: option '--step <n>' argument 'x' is invalid: must be a non-negative integer (see 'orbax2reg inspect --help')\n",
    );
  });

  test("one argument too many is one line", async () => {
    const r = await runCli(["inspect", TINY, "extra"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe("orbax2reg: too many arguments for 'inspect'. Expected 1 argument but got 2 (see 'orbax2reg inspect --help')\n");
  });

  test("a near miss keeps commander's guess, on the same line", async () => {
    const r = await runCli(["inspect", TINY, "--jsn"]);
    expect(r.stderr).toBe("orbax2reg: unknown option '--jsn', did you mean --json? (see 'orbax2reg inspect --help')\n");
  });

  test("an unknown command names the help of the level it was looked for at", async () => {
    expect((await runCli(["frobnicate"])).stderr).toBe("orbax2reg: unknown command 'frobnicate' (see 'orbax2reg --help')\n");
    const r = await runCli(["cloud", "stats"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/^orbax2reg: unknown command 'stats', did you mean status\? \(see 'orbax2reg cloud --help'\)\n$/);
  });

  test("cloud start --export-only or --export-tasks without --export is refused before any setting is read", async () => {
    for (const extra of [["--export-only"], ["--export-tasks", "8"]]) {
      const r = await runCli(["cloud", "start", "gs://b/runs/exp/step_00000100", ...extra]);
      expect(r.code).toBe(2);
      expect(r.stderr).toBe("orbax2reg: --export-only and --export-tasks need --export <folder>: where the export goes\n");
    }
  });

  test("the executable prints exactly that line and exits 2", () => {
    const r = runBin(["convert", "--foo", TINY, "/tmp/regular"]);
    expect(r.code).toBe(2);
    expect(r.stdout).toBe("");
    expect(r.stderr).toBe("orbax2reg: unknown option '--foo' (see 'orbax2reg convert --help')\n");
  });
});

test("--help still prints the whole help on stdout, exit 0, and says what the exit codes mean", async () => {
  const r = await runCli(["--help"]);
  expect(r.code).toBe(0);
  expect(r.stdout).toMatch(/^Usage: orbax2reg/);
  expect(r.stdout.replace(/\s+/g, " ")).toContain("Exit codes: 0 success; 1 unexpected failure");
});
