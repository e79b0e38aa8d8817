// A step saved by AXLearn's own OrbaxCheckpointer from two jax.distributed processes, each with its own tf.data
// iterator (test/fixtures-gen/axlearn_orbax.py: tfds/tf_<i>/input_iter.index and .data-00000-of-00001), converted
// and restored by AXLearn's own Checkpointer on two processes. Needs AXLearn (ORBAX2REG_AXLEARN at setup).
import { existsSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { verify } from "../../src/convert/verify.js";
import { runCli } from "../helpers/cli.js";
import { axlearnRestore, axlearnUnavailable, copyOf, type RestoreSummary, removeScratch, scratch } from "../helpers/convert.js";
import { AXLEARN_ORBAX_ROOT } from "../helpers/paths.js";

afterAll(removeScratch);

const STEP = `${AXLEARN_ORBAX_ROOT}/checkpoints/step_00000100`;
const unavailable = axlearnUnavailable() ?? (existsSync(STEP) ? undefined : `no ${STEP} (the global setup writes it with AXLearn)`);
const skipName = unavailable === undefined ? "" : ` (skipped: ${unavailable})`;
const TF_FILES = (pid: number) => [`tfds/tf_${pid}/input_iter.data-00000-of-00001`, `tfds/tf_${pid}/input_iter.index`];

describe(`a two-process step saved by AXLearn's OrbaxCheckpointer with tf.data iterators${skipName}`, () => {
  const dest = scratch("axlearn-orbax");
  let restored: RestoreSummary | undefined;

  beforeAll(async () => {
    if (unavailable !== undefined) return;
    expect((await runCli(["convert", STEP, dest])).code).toBe(0);
    const next = JSON.parse(readFileSync(join(AXLEARN_ORBAX_ROOT, "expected.json"), "utf8")).next as number[];
    restored = axlearnRestore([
      {
        name: "tf-two-processes",
        root: dest,
        step: 100,
        mode: "trainer",
        source_index: join(STEP, "index"),
        source_item: join(STEP, "state"),
        processes: 2,
        tf_iterator: { range: 1000, next },
      },
    ]).get("tf-two-processes");
  }, 300_000);

  test("inspect shows both processes and each one's tf.data iterator files", async (ctx) => {
    if (unavailable !== undefined) ctx.skip();
    const r = await runCli(["inspect", STEP, "--json"]);
    expect(JSON.parse(r.stdout).processes).toEqual({
      count: 2,
      databases: [0, 1],
      arrayMetadatas: [0, 1],
      iterators: [
        { process: 0, files: TF_FILES(0) },
        { process: 1, files: TF_FILES(1) },
      ],
      missingIterators: [],
    });
  });

  test("convert writes each process's files to its own tf_<i>/ and verify checks both byte for byte", async (ctx) => {
    if (unavailable !== undefined) ctx.skip();
    for (const pid of [0, 1]) {
      for (const f of TF_FILES(pid)) {
        const target = join(dest, "step_00000100", f.replace(/^tfds\//, ""));
        expect(readFileSync(target).equals(readFileSync(join(STEP, f))), f).toBe(true);
      }
    }
    const r = await verify(STEP, join(dest, "step_00000100"));
    expect(r.failed).toBe(0);
    expect(r.checks.filter((c) => c.name.startsWith("iterator files of process")).length).toBe(2);
  });

  test("AXLearn's Checkpointer restores it on two processes under EXACT: each process's iterator resumes where its own left off", (ctx) => {
    if (unavailable !== undefined) ctx.skip();
    expect(restored?.problems).toEqual([]);
    expect(restored?.processes?.map((p) => [p.process, p.validation, p.matched === p.arrays, p.iterators])).toEqual([
      [0, "EXACT", true, { input_iter: true }],
      [1, "EXACT", true, { input_iter: true }],
    ]);
  });

  test.for([
    ["process 1's whole tfds/tf_1", "tfds/tf_1", TF_FILES(1)],
    ["only process 1's data file", "tfds/tf_1/input_iter.data-00000-of-00001", [TF_FILES(1)[0]]],
  ] as const)(
    "without %s, convert refuses (exit 2, naming what is missing), --allow-uncommitted or not",
    async ([, removed, missing], ctx) => {
      if (unavailable !== undefined) ctx.skip();
      const step = copyOf(STEP, "axlearn-orbax-missing");
      rmSync(join(step, removed), { recursive: true });
      for (const extra of [[], ["--allow-uncommitted"]]) {
        const out = scratch("axlearn-orbax-refused");
        const r = await runCli(["convert", step, out, ...extra]);
        expect(r.code).toBe(2);
        for (const f of missing) expect(r.stderr).toContain(`process 1 lacks ${f}`);
        expect(existsSync(join(out, "step_00000100", "index"))).toBe(false);
      }
    },
  );
});
