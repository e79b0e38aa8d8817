// The exit codes README's table gives: 1 is kept for failures nobody expected; a check that finds a difference
// has a code of its own; what the user typed wrong (a path, a bucket) is bad input, 2, naming it.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { EXIT_CHECK_FAILED } from "../../src/errors.js";
import { runCli } from "../helpers/cli.js";
import { fixtureCase, removeScratch, scratch } from "../helpers/convert.js";

afterAll(removeScratch);

const tiny = fixtureCase("tiny");
const NO_BUCKET = "orbax2reg-no-such-bucket-4d2c";

async function converted(label: string): Promise<string> {
  const dest = scratch(label);
  expect((await runCli(["convert", tiny.location, dest, "--no-progress"])).code).toBe(0);
  return dest;
}

describe("verify", () => {
  test("a difference is exit 4 (not 1, which is for bugs), with the failing check named", async () => {
    const dest = await converted("differs");
    writeFileSync(join(dest, tiny.stepDir, "gda/model/decoder/layer/ffn/weight/0.0"), "not the chunk");
    const r = await runCli(["verify", tiny.location, join(dest, tiny.stepDir)]);
    expect(EXIT_CHECK_FAILED).toBe(4);
    expect(r.code).toBe(4);
    expect(r.stdout).toMatch(/^FAIL gda\/model\/decoder\/layer\/ffn\/weight: /m);
    expect(r.stdout).toMatch(/^\d+ passed, 1 failed$/m);
  });

  test("--json too: exit 4 and the checks on stdout", async () => {
    const dest = await converted("differs-json");
    writeFileSync(join(dest, tiny.stepDir, "index"), "[]");
    const r = await runCli(["verify", tiny.location, join(dest, tiny.stepDir), "--json"]);
    expect(r.code).toBe(4);
    expect(JSON.parse(r.stdout)).toMatchObject({ failed: 1 });
  });

  test("given the destination root instead of the step under it: exit 2, naming the step to give", async () => {
    const dest = await converted("root");
    const r = await runCli(["verify", tiny.location, dest]);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe(
      `orbax2reg: ${dest}: a root of step_* directories, not a converted step: verify takes the step itself, e.g. ${dest}/${tiny.stepDir}\n`,
    );
  });
});

describe("a local path that does not exist is said to: exit 2", () => {
  const missing = join(scratch("missing"), "no-such-dir");
  test.each([
    ["inspect", [missing]],
    ["convert", [missing, scratch("dest")]],
    ["plan", [missing, scratch("dest")]],
    ["verify", [missing, missing]],
    ["ocdbt ls", [missing]],
  ])("%s", async (command, args) => {
    const r = await runCli([...command.split(" "), ...args]);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe(`orbax2reg: ${missing}: does not exist\n`);
  });

  test("verify's converted step, too", async () => {
    const r = await runCli(["verify", tiny.location, missing]);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe(`orbax2reg: ${missing}: does not exist\n`);
  });
});

describe("a source in a bucket that does not exist is bad input, not the destination's problem: exit 2 naming the bucket", () => {
  test.each([
    ["inspect", [`gs://${NO_BUCKET}/run/step_00000100`]],
    ["convert", [`gs://${NO_BUCKET}/run/step_00000100`, "DEST"]],
    ["verify", [tiny.location, `gs://${NO_BUCKET}/regular/step_00000100`]],
    [
      "cloud status",
      [`gs://${NO_BUCKET}/run`, "--workflow", "projects/p/locations/r/workflows/w", "--destination-template", "gs://{bucket}/regular"],
    ],
  ])("%s", async (command, args) => {
    const r = await runCli([...command.split(" "), ...args.map((a) => (a === "DEST" ? scratch("dest") : a))]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(
      new RegExp(`^orbax2reg: gs://${NO_BUCKET}/\\S+: the bucket gs://${NO_BUCKET} does not exist \\(HTTP 404.*\\n$`),
    );
  });
});

test("README's exit-code table and docs/cli.md's are the same, and give every code the CLI exits with", () => {
  const rows = (file: string) => {
    const text = readFileSync(file, "utf8");
    const lines = text.slice(text.indexOf("| code | meaning | examples |")).split("\n");
    const table = lines.slice(
      2,
      lines.findIndex((l) => !l.startsWith("|")),
    );
    return table.sort();
  };
  const readme = rows("README.md");
  // Sorted as text: 141 (a closed pipe: bin/orbax2reg.js) after 1.
  expect(readme.map((r) => Number(r.split("|")[1]))).toEqual([0, 1, 141, 2, 3, 4]);
  expect(rows("docs/cli.md")).toEqual(readme);
});
