// A step as AXLearn leaves it when its save is killed before Orbax's finalize (local filesystem, written by the
// real orbax: test/fixtures-gen/interrupted.py): `step_00000200.orbax-checkpoint-tmp/` holding
// `state.orbax-checkpoint-tmp/` (one unmerged per-process database) and `index.orbax-checkpoint-tmp/index`.
import { cpSync, existsSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { verify } from "../../src/convert/verify.js";
import { arraySha256, listArrays } from "../../src/orbax/arrays.js";
import { openStep } from "../../src/orbax/step.js";
import { runCli } from "../helpers/cli.js";
import { removeScratch, scratch } from "../helpers/convert.js";
import { INTERRUPTED_ROOT } from "../helpers/paths.js";

const TMP_NAME = "step_00000200.orbax-checkpoint-tmp";
const STEP = `${INTERRUPTED_ROOT}/${TMP_NAME}`;

afterAll(removeScratch);

describe("a step whose save was killed before Orbax finalized it", () => {
  test("converted by its temporary directory with --allow-uncommitted, takes the step from the name", async () => {
    const dest = scratch("tmp-step");
    const r = await runCli(["convert", STEP, dest, "--allow-uncommitted"]);
    expect(r.stderr).not.toMatch(/pass --step/);
    expect(r.code).toBe(0);
    expect((await verify(STEP, join(dest, "step_00000200"))).failed).toBe(0);
  });

  test("whose directory name says nothing takes the step from index/index", async () => {
    const copy = join(scratch("renamed"), "copied-somewhere");
    cpSync(STEP, copy, { recursive: true });
    expect((await openStep(copy)).step).toBe(200);
  });

  test("under its root, --step 200 --allow-uncommitted finds the temporary directory", async () => {
    const dest = scratch("tmp-root");
    const r = await runCli(["convert", INTERRUPTED_ROOT, dest, "--step", "200", "--allow-uncommitted"]);
    expect(r.stderr).not.toMatch(/no step 200/);
    expect(r.code).toBe(0);
    expect(existsSync(join(dest, "step_00000200", "index"))).toBe(true);
  });

  test("without --allow-uncommitted is refused as uncommitted, naming the temporary directory", async () => {
    const r = await runCli(["convert", INTERRUPTED_ROOT, scratch("refused"), "--step", "200"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`${TMP_NAME}: step is not committed (temporary directory name`);
  });

  test("its items under their temporary names are read: the AXLearn layout, and the arrays TensorStore reads", async () => {
    const step = await openStep(STEP);
    expect([step.layout, step.itemDir, step.indexKey]).toEqual([
      "axlearn",
      "state.orbax-checkpoint-tmp",
      "index.orbax-checkpoint-tmp/index",
    ]);
    const expected = JSON.parse(readFileSync(`${INTERRUPTED_ROOT}/expected.json`, "utf8")) as Record<string, { sha256: string }>;
    const seen: string[] = [];
    for await (const a of listArrays(step)) {
      expect(await arraySha256(step, a), a.leaf.path).toBe(expected[a.leaf.path]?.sha256);
      seen.push(a.leaf.path);
    }
    expect(seen.sort()).toEqual(Object.keys(expected).sort());
  });

  test("without its state item is refused, naming the item that is missing", async () => {
    const copy = join(scratch("no-state"), TMP_NAME);
    cpSync(STEP, copy, { recursive: true });
    rmSync(join(copy, "state.orbax-checkpoint-tmp"), { recursive: true });
    await expect(openStep(copy)).rejects.toThrow(/no state item \(state\/ or state\.orbax-checkpoint-tmp\/\)/);
  });
});
