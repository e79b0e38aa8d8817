import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { removeScratch, scratch } from "../helpers/convert.js";

// bench/lib.mjs's flags(), as a benchmark uses it: a stand-in script (a header comment, then the flags a
// benchmark declares) run with a command line; it prints what flags() gave it as JSON.

const LIB = pathToFileURL(resolve("bench/lib.mjs")).href;
const BENCHMARK = `#!/usr/bin/env node
// A stand-in benchmark.
//
//   node bench/stand-in.mjs <step> [--runs N] [--profile]
import { flag, flags } from "${LIB}";

const opts = flags(
  process.argv.slice(2),
  {
    "--runs": flag.count(3),
    "--delay": flag.number(30, { metavar: "MS" }),
    "--rows": flag.some("tls,plain", ["tls", "latency", "plain"]),
    "--tasks": flag.counts(undefined),
    "--profile": flag.on(),
    "--max-shard-size": flag.text("50MB", "SIZE"),
  },
  { positionals: { names: "<step>", min: 1, max: 1 } },
);
console.log(JSON.stringify(opts));
`;

let script: string;
beforeAll(() => {
  script = join(scratch("bench-flags"), "stand-in.mjs");
  writeFileSync(script, BENCHMARK);
});
afterAll(() => removeScratch());

const run = (...argv: string[]) => spawnSync(process.execPath, [script, ...argv], { encoding: "utf8" });

describe("a benchmark's command line (bench/lib.mjs flags())", () => {
  test("gives every flag typed by its camelCased name, an absent one its default", () => {
    const r = run("STEP", "--runs", "5", "--profile", "--tasks", "1,2,4");
    expect(r.status).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual({
      runs: 5,
      delay: 30,
      rows: ["tls", "plain"],
      tasks: [1, 2, 4],
      profile: true,
      maxShardSize: "50MB",
      _: ["STEP"],
    });
  });

  test("takes flags before, after and around the other arguments", () => {
    const r = run("--delay", "0", "STEP", "--rows", "latency");
    expect(JSON.parse(r.stdout)).toMatchObject({ delay: 0, rows: ["latency"], _: ["STEP"] });
  });

  test.each([
    [["STEP", "--runs", "0"], 'bench/stand-in.mjs: --runs takes a positive integer, not "0"'],
    [["STEP", "--runs", "1.5"], 'bench/stand-in.mjs: --runs takes a positive integer, not "1.5"'],
    [["STEP", "--delay", "-1"], 'bench/stand-in.mjs: --delay takes a number >= 0, not "-1"'],
    [["STEP", "--rows", "tls,foo"], 'bench/stand-in.mjs: --rows takes some of tls,latency,plain (separated by commas), not "tls,foo"'],
    [["STEP", "--runs"], "bench/stand-in.mjs: --runs takes a positive integer, and none was given"],
    [["STEP", "--runs", "--profile"], "bench/stand-in.mjs: --runs takes a positive integer, and none was given"],
    [["STEP", "--bogus"], "bench/stand-in.mjs: unknown flag --bogus"],
    [["STEP", "--runs", "2", "--runs", "3"], "bench/stand-in.mjs: --runs is given twice"],
    [["STEP", "extra"], "bench/stand-in.mjs: unexpected argument extra"],
    [[], "bench/stand-in.mjs: missing argument: <step> expected"],
  ])("refuses %j with exit 2 and one line", (argv, message) => {
    const r = run(...argv);
    expect(r.status).toBe(2);
    expect(r.stdout).toBe("");
    expect(r.stderr).toBe(`${message} (--help lists the flags)\n`);
  });

  test("--help prints the script's header comment and its flags with their defaults, and exits 0", () => {
    const r = run("--help");
    expect(r.status).toBe(0);
    expect(r.stdout).toBe(
      [
        "A stand-in benchmark.",
        "",
        "  node bench/stand-in.mjs <step> [--runs N] [--profile]",
        "flags: --runs N (3), --delay MS (30), --rows tls|latency|plain,... (tls,plain), --tasks N,..., --profile, --max-shard-size SIZE (50MB); --help",
        "",
      ].join("\n"),
    );
  });
});
