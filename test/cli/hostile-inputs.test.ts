// Broken and hostile steps (issue 44, section 4): each is a copy of a real step with one defect. Every command
// refuses it with one printable line naming the file and what is wrong, a non-zero exit, within seconds, and
// commits nothing; what a file put into a message or a table (control characters) is escaped.
import { cpSync, writeFileSync } from "node:fs";
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
