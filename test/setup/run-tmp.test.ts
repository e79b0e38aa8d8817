import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { describe, expect, test } from "vitest";
import { KEEP_TMP, makeRunTmp } from "../helpers/run-tmp.js";
import { tempDir } from "../helpers/tmp.js";

describe("the run's temporary folder", () => {
  test("the test workers' temporary folder is the run's own, made by the global setup", () => {
    expect(process.env.TMPDIR).toBe(tmpdir());
    expect(basename(tmpdir())).toMatch(/^orbax2reg-test-/);
    expect(dirname(tempDir("where"))).toBe(tmpdir());
  });

  test("ending the run removes the folder and everything in it", () => {
    const run = makeRunTmp(tempDir("base"), {});
    mkdirSync(join(run.dir, "a", "b"), { recursive: true });
    writeFileSync(join(run.dir, "a", "b", "f"), "x");
    run.end();
    expect(existsSync(run.dir)).toBe(false);
  });

  test(`with ${KEEP_TMP}=1 the folder is kept and where is printed`, () => {
    const said: string[] = [];
    const run = makeRunTmp(tempDir("base"), { [KEEP_TMP]: "1" }, (line) => said.push(line));
    run.end();
    expect(existsSync(run.dir)).toBe(true);
    expect(said).toEqual([`${KEEP_TMP}=1: kept this run's temporary files in ${run.dir}\n`]);
  });

  test("ending twice (the teardown, then the exit handler) removes once and does not throw", () => {
    const said: string[] = [];
    const run = makeRunTmp(tempDir("base"), {}, (line) => said.push(line));
    run.end();
    run.end();
    expect(existsSync(run.dir)).toBe(false);
    expect(said).toEqual([]);
  });
});
