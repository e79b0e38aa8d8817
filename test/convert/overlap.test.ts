// The destination may not be, contain or lie inside the source step, however it is spelled: symlinks,
// `..`, file:// URLs locally; empty segments (`//`) and trailing slashes in gs:// names.
import { cpSync, mkdirSync, symlinkSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { runCli } from "../helpers/cli.js";
import { copyOf, fileList, fixtureCase, removeScratch, scratch } from "../helpers/convert.js";
import { emulatorStorage, newBucket, uploadDir } from "../helpers/gcs.js";

afterAll(removeScratch);

const tiny = fixtureCase("tiny");

describe("a local destination that resolves into the source step", () => {
  const step = copyOf(tiny.location, "overlap");
  const parent = join(step, "..");
  const links = scratch("overlap-links");
  symlinkSync(parent, join(links, "to-parent"));
  symlinkSync(step, join(links, "to-step"));
  mkdirSync(join(links, "real"));
  const before = fileList(parent);

  test.each([
    ["a symlink to the source step's parent (the step would be written onto itself)", () => join(links, "to-parent")],
    ["a path below a symlink to the source step", () => join(links, "to-step", "regular")],
    ["a path through `..` back into the source step", () => join(links, "real", "..", "to-step", "x", "..", "y")],
    ["a file:// URL of the source's parent", () => `file://${parent}`],
  ])("is refused when it is %s: exit 2, and nothing is written", async (_label, dest) => {
    const r = await runCli(["convert", step, dest()]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/orbax2reg: the destination step .* overlaps the source step/);
    expect(fileList(parent)).toEqual(before);
  });
});

describe("a composite Orbax step (no index item) whose destination resolves onto it", () => {
  test("is refused before anything is written (no index lands in the source step)", async () => {
    const composite = fixtureCase("upstream-composite");
    const root = scratch("overlap-composite");
    cpSync(composite.location, join(root, "step_00000007"), { recursive: true });
    const before = fileList(root);
    const link = join(scratch("overlap-composite-link"), "dest");
    symlinkSync(root, link);
    const r = await runCli(["convert", join(root, "step_00000007"), link, "--step", "7"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/overlaps the source step/);
    expect(fileList(root)).toEqual(before);
  });
});

describe("gs:// names are compared in their canonical form", () => {
  test.each([
    ["a double slash", (b: string) => `gs://${b}//bd`],
    ["a trailing slash", (b: string) => `gs://${b}/bd/`],
    ["double and trailing slashes", (b: string) => `gs://${b}/bd//`],
  ])("a destination root spelled with %s that is the source's root is refused: exit 2, no object written", async (_label, dest) => {
    const bucket = await newBucket("overlap");
    await uploadDir(tiny.location, bucket, "bd/step_00000100");
    const [before] = await emulatorStorage().bucket(bucket).getFiles();
    const r = await runCli(["convert", `gs://${bucket}/bd/step_00000100`, dest(bucket)]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(new RegExp(`overlaps the source step gs://${bucket}/bd/step_00000100/`));
    const [after] = await emulatorStorage().bucket(bucket).getFiles();
    expect(after.map((f) => f.name).sort()).toEqual(before.map((f) => f.name).sort());
  });

  test("a source spelled with double slashes writes a plan naming the canonical locations", async () => {
    const bucket = await newBucket("canon");
    await uploadDir(tiny.location, bucket, "ckpt/step_00000100");
    const r = await runCli(["convert", `gs://${bucket}//ckpt//step_00000100`, `gs://${bucket}//out/`, "--json"]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ destination: `gs://${bucket}/out/step_00000100`, committed: true });
    const [files] = await emulatorStorage().bucket(bucket).getFiles({ prefix: "out/" });
    expect(files.some((f) => f.name === "out/step_00000100/index")).toBe(true);
    expect(files.every((f) => !f.name.includes("//"))).toBe(true);
  });
});
