// Every process's iterators: a step saved by two real jax.distributed processes, each writing its own
// python/python_<i>/input_iter through the PythonSavable handler (test/fixtures-gen, `multiprocess_iterators`).
// inspect shows the processes and each one's iterator files; convert refuses a step whose processes do not all have
// the same ones; verify checks each process's files byte for byte.
import { existsSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { verify } from "../../src/convert/verify.js";
import { runCli } from "../helpers/cli.js";
import { copyOf, fixtureCase, removeScratch, scratch } from "../helpers/convert.js";

afterAll(removeScratch);

const mp = fixtureCase("multiprocess-iterators");
const expectedFiles = () => JSON.parse(readFileSync(join(mp.location, "..", "expected_files.json"), "utf8"));

/** A copy of the two-process step without process 1's iterator file. */
function withoutProcess1(): string {
  const step = copyOf(mp.location, "mp-missing");
  rmSync(join(step, "python", "python_1"), { recursive: true });
  return step;
}

describe("inspect", () => {
  test("--json gives the process count from the step's per-process records and each process's iterator files", async () => {
    const r = await runCli(["inspect", mp.location, "--json"]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout).processes).toEqual({
      count: 2,
      databases: [0, 1],
      arrayMetadatas: [0, 1],
      iterators: [
        { process: 0, files: ["python/python_0/input_iter"] },
        { process: 1, files: ["python/python_1/input_iter"] },
      ],
      missingIterators: [],
    });
  });

  test("the table says how many processes saved the step and lists each one's iterator files", async () => {
    const r = await runCli(["inspect", mp.location]);
    expect(r.stdout).toMatch(/^2 processes saved it \(own OCDBT database: processes 0, 1; array_metadatas: processes 0, 1\)$/m);
    expect(r.stdout).toMatch(/^process 0 iterator files: python\/python_0\/input_iter$/m);
    expect(r.stdout).toMatch(/^process 1 iterator files: python\/python_1\/input_iter$/m);
  });

  test("a step whose process 1 lacks its iterator file: exit 0, process 1 listed with none, a warning naming the file", async () => {
    const r = await runCli(["inspect", withoutProcess1()]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^process 1 iterator files: none$/m);
    expect(r.stderr).toMatch(/process 1 lacks python\/python_1\/input_iter.*convert refuses this step/);
  });

  test("a single-process step reports one process", async () => {
    const r = await runCli(["inspect", fixtureCase("iterators").location, "--json"]);
    expect(JSON.parse(r.stdout).processes).toMatchObject({ count: 1, databases: [0], arrayMetadatas: [0], missingIterators: [] });
  });
});

describe("convert of a step whose processes do not all have the same iterator files", () => {
  const step = withoutProcess1();

  test("is refused: exit 2, one line naming the process and the missing file, no index written", async () => {
    const dest = scratch("mp-refused");
    const r = await runCli(["convert", step, dest]);
    expect(r.code).toBe(2);
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
    expect(r.stderr).toMatch(/2 processes .* process 1 lacks python\/python_1\/input_iter/);
    expect(existsSync(join(dest, mp.stepDir, "index"))).toBe(false);
  });

  test("is refused with --allow-uncommitted too", async () => {
    const r = await runCli(["convert", step, scratch("mp-refused-uncommitted"), "--allow-uncommitted"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/process 1 lacks python\/python_1\/input_iter/);
  });

  test("is refused when a tf.data iterator's data file is missing for one process, naming it", async () => {
    // Stand-in: the generator has no tensorflow, so the python files are renamed into the tfds/ layout that
    // AXLearn's _TfIteratorHandler writes (tf.train.Checkpoint's .index and .data-00000-of-00001 per process).
    const tf = copyOf(mp.location, "mp-tfds");
    for (const pid of [0, 1]) {
      const dir = join(tf, "tfds", `tf_${pid}`);
      (await import("node:fs")).mkdirSync(dir, { recursive: true });
      renameSync(join(tf, "python", `python_${pid}`, "input_iter"), join(dir, "input_iter.index"));
      if (pid === 0) writeFileSync(join(dir, "input_iter.data-00000-of-00001"), "data");
    }
    rmSync(join(tf, "python"), { recursive: true });
    const r = await runCli(["convert", tf, scratch("mp-tfds-out")]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/process 1 lacks tfds\/tf_1\/input_iter\.data-00000-of-00001/);
  });

  test("converts with --params-only, which copies no iterators", async () => {
    const dest = scratch("mp-params");
    expect((await runCli(["convert", step, dest, "--params-only"])).code).toBe(0);
    expect((await verify(step, join(dest, mp.stepDir))).failed).toBe(0);
  });
});

describe("convert and verify of a step saved by two processes", () => {
  const dest = scratch("mp-out");
  const stepDir = join(dest, mp.stepDir);

  beforeAll(async () => {
    expect((await runCli(["convert", mp.location, dest])).code).toBe(0);
  });

  test("each process's iterator file goes to its own python_<i>/, byte for byte", () => {
    const files = expectedFiles();
    for (const pid of [0, 1]) {
      const source = readFileSync(join(mp.location, "python", `python_${pid}`, "input_iter"));
      expect(readFileSync(join(stepDir, `python_${pid}`, "input_iter")).equals(source)).toBe(true);
      expect(files[`step_00000100/python/python_${pid}/input_iter`].msgpack.shard).toBe(pid);
    }
  });

  test("verify checks each process's iterator files and passes", async () => {
    const r = await verify(mp.location, stepDir);
    expect(r.failed).toBe(0);
    expect(r.checks.map((c) => c.name)).toEqual(expect.arrayContaining(["iterator files of process 0", "iterator files of process 1"]));
  });

  test("verify fails process 1 when its iterator file is missing from the output", async () => {
    const copy = copyOf(stepDir, "mp-out-missing");
    rmSync(join(copy, "python_1"), { recursive: true });
    const r = await verify(mp.location, copy);
    expect(r.checks.filter((c) => !c.ok)).toEqual([
      { name: "iterator files of process 1", ok: false, detail: "python_1/input_iter is missing" },
    ]);
  });

  test("verify fails process 1 when its iterator file differs from the source's", async () => {
    const copy = copyOf(stepDir, "mp-out-changed");
    writeFileSync(join(copy, "python_1", "input_iter"), readFileSync(join(copy, "python_0", "input_iter")));
    const r = await verify(mp.location, copy);
    expect(r.checks.filter((c) => !c.ok).map((c) => [c.name, c.detail])).toEqual([
      ["iterator files of process 1", expect.stringMatching(/^python_1\/input_iter differs from /)],
    ]);
  });

  test("verify against a source whose process 1 lacks its iterator file fails process 1, naming the file", async () => {
    const r = await verify(withoutProcess1(), stepDir);
    const failed = r.checks.filter((c) => !c.ok);
    expect(failed.map((c) => c.name)).toContain("iterator files of process 1");
    expect(failed.find((c) => c.name === "iterator files of process 1")?.detail).toMatch(/source lacks python\/python_1\/input_iter/);
  });
});
