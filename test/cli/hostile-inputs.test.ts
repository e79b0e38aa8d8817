// Broken and hostile steps (issue 44, section 4): each is a copy of a real step with one defect. Every command
// refuses it with one printable line naming the file and what is wrong, a non-zero exit, within seconds, and
// commits nothing; what a file put into a message or a table (control characters) is escaped.
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { runCli } from "../helpers/cli.js";
import { fixtureCase, removeScratch, scratch } from "../helpers/convert.js";
import { rewrittenStep } from "../helpers/many-keys.js";
import { tempDir } from "../helpers/tmp.js";

afterAll(removeScratch);

const tiny = fixtureCase("tiny");
/** Any character a terminal or a log would act on. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: finding control characters is what it is for.
const CONTROL = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/;

/** A copy of tiny's step in a folder of its own. */
function copyOfTiny(): string {
  const step = join(tempDir("hostile"), tiny.stepDir);
  cpSync(tiny.location, step, { recursive: true });
  return step;
}

/** The output of a refusal: one line on stderr, nothing on stdout. */
function expectOneLine(r: { code: number; stdout: string; stderr: string }, code: number, pattern: RegExp): void {
  expect(r.code).toBe(code);
  expect(r.stderr).toMatch(pattern);
  expect(r.stderr.trimEnd().split("\n")).toHaveLength(1);
  expect(r.stderr).not.toMatch(CONTROL);
}

describe("metadata that is not JSON is refused without quoting its raw bytes", () => {
  const crafted = "\r\n\u0000\u0007\u001b[31mFAKE LOG LINE";

  test("_METADATA", async () => {
    const step = copyOfTiny();
    writeFileSync(join(step, "state", "_METADATA"), crafted);
    for (const command of [
      ["inspect", step],
      ["convert", step, scratch("bad-metadata"), "--no-progress"],
    ]) {
      expectOneLine(await runCli(command), 2, /state\/_METADATA: not valid JSON .*\\r\\n\\u0000\\u0007\\u001b\[31m/);
    }
  });

  test("_CHECKPOINT_METADATA", async () => {
    const step = copyOfTiny();
    writeFileSync(join(step, "_CHECKPOINT_METADATA"), crafted);
    expectOneLine(await runCli(["inspect", step]), 2, /_CHECKPOINT_METADATA: not valid JSON/);
  });
});

describe("a key holding a NUL byte", () => {
  let step = "";
  beforeAll(async () => {
    step = await rewrittenStep(
      tiny.location,
      (entries) => entries.map((e) => ({ ...e, key: e.key.replace(/^prng_key\//, "prng\u0000key/") })),
      (text) => text.replaceAll("'prng_key'", "'prng\\\\x00key'").replaceAll('"key": "prng_key"', '"key": "prng\\u0000key"'),
    );
  });

  test("inspect's table shows it escaped", async () => {
    const r = await runCli(["inspect", step]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^prng\\u0000key +uint32/m);
    expect(r.stdout).not.toMatch(CONTROL);
  });

  test("convert refuses it in one printable line", async () => {
    expectOneLine(
      await runCli(["convert", step, scratch("nul-key"), "--no-progress"]),
      2,
      /refusing key "gda\/prng\\u0000key\/\.zarray": NUL byte in key/,
    );
  });

  test("verify's FAIL line shows it escaped", async () => {
    const dest = scratch("nul-key-verify");
    expect((await runCli(["convert", tiny.location, dest, "--no-progress"])).code).toBe(0);
    const r = await runCli(["verify", step, join(dest, tiny.stepDir), "--no-progress"]);
    expect(r.code).toBe(4);
    expect(r.stdout).toMatch(/^FAIL gda\/prng\\u0000key: /m);
    expect(r.stdout).not.toMatch(CONTROL);
  });
});

describe("symbolic links and special files", () => {
  test("a step folder that is a symbolic link to itself: every command says so in one line", async () => {
    const root = tempDir("self-link");
    const step = join(root, tiny.stepDir);
    symlinkSync(step, step);
    const converted = scratch("self-link-converted");
    expect((await runCli(["convert", tiny.location, converted, "--no-progress"])).code).toBe(0);
    for (const command of [
      ["inspect", step],
      ["convert", step, scratch("self-link"), "--no-progress"],
      ["export-hf", step, scratch("self-link-hf"), "--no-progress"],
      ["verify", step, join(converted, tiny.stepDir), "--no-progress"],
      ["verify", tiny.location, step, "--no-progress"],
    ]) {
      expectOneLine(await runCli(command), 2, /step_00000100(\/[\w.]+)?: a symbolic link loop/);
    }
  });

  test("an OCDBT data file that is a named pipe: convert and verify refuse it instead of waiting for a writer", async () => {
    const step = copyOfTiny();
    const data = join(step, "state", "ocdbt.process_0", "d", "b2a63ebe4de088f4101b266b4099e05d");
    rmSync(data);
    execFileSync("mkfifo", [data]);
    const dest = scratch("fifo");
    expectOneLine(
      await runCli(["convert", step, dest, "--no-progress"]),
      2,
      /b2a63ebe4de088f4101b266b4099e05d: is a named pipe \(FIFO\), not a regular file\n/,
    );
    expect(existsSync(join(dest, tiny.stepDir, "index"))).toBe(false);
    const converted = scratch("fifo-converted");
    expect((await runCli(["convert", tiny.location, converted, "--no-progress"])).code).toBe(0);
    const r = await runCli(["verify", step, join(converted, tiny.stepDir), "--no-progress"]);
    expect(r.code).toBe(4);
    expect(r.stdout).toMatch(/^FAIL gda\/model\/decoder\/layer\/ffn\/weight: .*: is a named pipe \(FIFO\), not a regular file$/m);
  }, 20_000);

  test("a symbolic link cycle in an iterator folder is refused, not followed 40 levels deep", async () => {
    const step = copyOfTiny();
    mkdirSync(join(step, "python", "python_0"), { recursive: true });
    writeFileSync(join(step, "python", "python_0", "iterator.json"), "{}");
    symlinkSync(".", join(step, "python", "python_0", "loop"));
    const dest = scratch("iterator-cycle");
    const cycle = /python\/python_0\/loop: a symbolic link cycle: this directory leads back to a directory above it\n/;
    expectOneLine(await runCli(["inspect", step]), 2, cycle);
    expectOneLine(await runCli(["convert", step, dest, "--no-progress"]), 2, cycle);
    expect(existsSync(join(dest, tiny.stepDir, "index"))).toBe(false);
  });
});

describe("a location that is not an Orbax step directory says what it is", () => {
  test("a regular step given to inspect", async () => {
    const dest = scratch("regular-to-inspect");
    expect((await runCli(["convert", tiny.location, dest, "--no-progress"])).code).toBe(0);
    expectOneLine(
      await runCli(["inspect", join(dest, tiny.stepDir)]),
      2,
      /step_00000100: is an AXLearn regular checkpoint step \(index and gda\/\), not an Orbax checkpoint: this command reads Orbax steps/,
    );
  });

  test("a file given where a folder is expected", async () => {
    expectOneLine(
      await runCli(["inspect", join(tiny.location, "_CHECKPOINT_METADATA")]),
      2,
      /_CHECKPOINT_METADATA: is a file, not a directory/,
    );
  });
});

describe("an index item that disagrees with _METADATA is refused before anything is committed, and fails verify", () => {
  const INDEX_ENTRY = '"model/decoder/layer/ffn/weight", {"dtype": "float32", "shape": "(64, 64)"}';
  const cases = [
    [
      "a shape",
      '"model/decoder/layer/ffn/weight", {"dtype": "float32", "shape": "(64, 32)"}',
      /index says float32 \(64, 32\) for array model\/decoder\/layer\/ffn\/weight, but the array stored is float32 \(64, 64\)/,
    ],
    [
      "a dtype",
      '"model/decoder/layer/ffn/weight", {"dtype": "bfloat16", "shape": "(64, 64)"}',
      /index says bfloat16 \(64, 64\) for array model\/decoder\/layer\/ffn\/weight/,
    ],
    [
      "a path",
      '"model/decoder/layer/ffn/weights", {"dtype": "float32", "shape": "(64, 64)"}',
      /index has no entry for array model\/decoder\/layer\/ffn\/weight \(float32 \(64, 64\)\), which _METADATA lists/,
    ],
  ] as const;

  test.each(cases)("%s", async (_, entry, message) => {
    const step = copyOfTiny();
    const indexFile = join(step, "index", "index");
    const text = readFileSync(indexFile, "utf8");
    expect(text).toContain(INDEX_ENTRY);
    writeFileSync(indexFile, text.replace(INDEX_ENTRY, entry));
    const dest = scratch("index-disagrees");
    const r = await runCli(["convert", step, dest, "--no-progress"]);
    expectOneLine(r, 2, new RegExp(`index/index: ${message.source}`));
    expect(existsSync(join(dest, tiny.stepDir, "index"))).toBe(false);

    const converted = scratch("index-disagrees-verify");
    expect((await runCli(["convert", tiny.location, converted, "--no-progress"])).code).toBe(0);
    const v = await runCli(["verify", step, join(converted, tiny.stepDir), "--no-progress"]);
    expect(v.code).toBe(4);
    expect(v.stdout).toMatch(new RegExp(`^FAIL index: .*${message.source}`, "m"));
  });

  test("an index array entry _METADATA does not list", async () => {
    const step = copyOfTiny();
    const indexFile = join(step, "index", "index");
    writeFileSync(
      indexFile,
      readFileSync(indexFile, "utf8").replace(INDEX_ENTRY, `${INDEX_ENTRY}], ["model/extra", {"dtype": "float32", "shape": "(2,)"}`),
    );
    expectOneLine(
      await runCli(["convert", step, scratch("index-extra"), "--no-progress"]),
      2,
      /index names an array model\/extra that _METADATA does not list/,
    );
  });
});
