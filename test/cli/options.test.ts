import { existsSync } from "node:fs";
import { join } from "node:path";
import { afterAll, afterEach, describe, expect, expectTypeOf, test, vi } from "vitest";
import { COMMANDS } from "../../src/cli/main.js";
import { type Flags, OPTIONS, optionSpec } from "../../src/cli/options.js";
import { mibToBytes } from "../../src/defaults.js";
import { runCli } from "../helpers/cli.js";
import { fixtureCase, removeScratch, scratch, WORK_DIR } from "../helpers/convert.js";

// The CLI's options are declared once (src/cli/options.ts); each command lists the ones it takes.

afterAll(removeScratch);

/** Help text with its line wrapping undone: commander wraps long descriptions at the terminal's width. */
const flat = (text: string) => text.replace(/\s+/g, " ");

describe("every command's --help", () => {
  test.each(COMMANDS.map((c) => [[c.parent, c.name].filter(Boolean).join(" "), c] as const))(
    "%s lists its options with their descriptions and the table's defaults",
    async (_, command) => {
      const r = await runCli([...(command.parent ? [command.parent] : []), command.name, "--help"]);
      expect(r.code).toBe(0);
      const help = flat(r.stdout);
      for (const use of command.options) {
        const spec = optionSpec(use);
        const shown = spec.default === undefined ? "" : ` (default: ${JSON.stringify(spec.default)})`;
        expect(help).toContain(` ${spec.flags} ${flat(spec.description)}${shown}`);
      }
    },
  );
});

test("every option in the table is taken by some command", () => {
  const used = new Set(COMMANDS.flatMap((c) => c.options.map((u) => (typeof u === "string" ? u : u.name))));
  expect(Object.keys(OPTIONS).filter((name) => !used.has(name as keyof typeof OPTIONS))).toEqual([]);
});

test("a command's runner receives its options typed from the table (checked by tsc)", () => {
  type F = Flags<readonly ["groups", "json", "destination", { readonly name: "step"; readonly required: true }, "step"]>;
  // A parser's result, always there with a default or when required; a switch or a text value only when given.
  expectTypeOf<F["groups"]>().toEqualTypeOf<number>();
  expectTypeOf<F["step"]>().toEqualTypeOf<number>();
  expectTypeOf<F["json"]>().toEqualTypeOf<boolean | undefined>();
  expectTypeOf<F["destination"]>().toEqualTypeOf<string | undefined>();
  expectTypeOf<F>().not.toHaveProperty("force");
});

test("a command's own words change an option's description, never its parser or default", () => {
  expect(optionSpec({ name: "groups", description: "parameter groups, balanced by bytes" })).toEqual({
    ...OPTIONS.groups,
    description: "parameter groups, balanced by bytes",
  });
});

test("--memory from 2 GiB up is a budget in bytes, not a 32-bit shift that wraps", () => {
  expect(mibToBytes(2048)).toBe(2 * 2 ** 30);
  expect(mibToBytes(4096)).toBe(4 * 2 ** 30);
});

describe("convert-group in a Cloud Run job task", () => {
  const tiny = fixtureCase("tiny");
  const planned = async () => {
    const dest = scratch("task");
    expect((await runCli(["plan", tiny.location, dest])).code).toBe(0);
    return dest;
  };
  const groupReport = (dest: string, name: string) => existsSync(join(dest, tiny.stepDir, WORK_DIR, "groups", name));
  afterEach(() => {
    vi.unstubAllEnvs();
  });

  test("without --task-index and --task-count, copies the share of the task Cloud Run says it is", async () => {
    const dest = await planned();
    vi.stubEnv("CLOUD_RUN_TASK_INDEX", "1");
    vi.stubEnv("CLOUD_RUN_TASK_COUNT", "2");
    expect((await runCli(["convert-group", dest, "--step", "100", "--group", "0"])).code).toBe(0);
    expect(groupReport(dest, "0-1.json")).toBe(true);
  });

  test("the flags win over Cloud Run's variables", async () => {
    const dest = await planned();
    vi.stubEnv("CLOUD_RUN_TASK_INDEX", "1");
    vi.stubEnv("CLOUD_RUN_TASK_COUNT", "2");
    const r = await runCli(["convert-group", dest, "--step", "100", "--group", "0", "--task-index", "2", "--task-count", "3"]);
    expect(r.code).toBe(0);
    expect(groupReport(dest, "0-2.json")).toBe(true);
  });

  test("outside Cloud Run the group is one task", async () => {
    const dest = await planned();
    vi.stubEnv("CLOUD_RUN_TASK_INDEX", undefined);
    vi.stubEnv("CLOUD_RUN_TASK_COUNT", undefined);
    expect((await runCli(["convert-group", dest, "--step", "100", "--group", "0"])).code).toBe(0);
    expect(groupReport(dest, "0.json")).toBe(true);
  });

  test("a malformed task variable it would use is one line naming it, exit 2", async () => {
    const dest = await planned();
    vi.stubEnv("CLOUD_RUN_TASK_COUNT", "two");
    const r = await runCli(["convert-group", dest, "--step", "100", "--group", "0"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe('orbax2reg: environment variable CLOUD_RUN_TASK_COUNT="two": must be an integer from 1 to 1000000\n');
  });
});
