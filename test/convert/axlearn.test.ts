// AXLearn's own code restores what orbax2reg writes: its real source (apple/axlearn, installed into .venv-axlearn
// by scripts/install.sh from ORBAX2REG_AXLEARN; CI sets it to the vendored snapshot), run by
// test/python/axlearn_restore.py. Full conversions restore with the regular Checkpointer under EXACT validation
// (every array and every iterator file); exports restore the way InferenceRunner does, through its default
// TensorStoreStateStorageBuilder (CONTAINS_STATE_UP_TO_DTYPE). Every restored value is compared bit for bit with
// the source (cast with jnp's astype where the export or the target specs are bfloat16).
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import {
  axlearnRestore,
  axlearnUnavailable,
  convertWith,
  FIXTURE_CASES,
  type FixtureCase,
  fixtureCase,
  type RestoreCase,
  type RestoreSummary,
  removeScratch,
  SAMPLE,
  scratch,
} from "../helpers/convert.js";

afterAll(removeScratch);

const unavailable = axlearnUnavailable();
const skipName = unavailable === undefined ? "" : ` (skipped: ${unavailable})`;
const out = scratch("axlearn");
let results = new Map<string, RestoreSummary>();

/** Every fixture with an AXLearn index (what read_state_spec reads): all but Orbax's own composite checkpoint. */
const TRAINER_CASES = FIXTURE_CASES.filter((c) => c.index !== undefined);
/** Cast exports restored under EXACT with the source's specs cast to bfloat16: every source encoding and dtype. */
const CAST_CASES = ["shared-dtypes", "dtypes", "shared-zarr3", "zarr3-nofill", "large"].map(fixtureCase);
const tiny = fixtureCase("tiny");

const source = (c: FixtureCase) => ({
  step: Number(c.stepDir.slice(-8)),
  source_index: dirname(c.index as string),
  source_item: c.item,
  ...(c.id.endsWith("iterators") ? { source_python: `${c.location}/python/python_0` } : {}),
});

/** An export of tiny and how InferenceRunner's builder restores it. */
const EXPORTS: { id: string; label: string; options: { paramsOnly?: boolean; dtype?: "bfloat16" }; model: "float32" | "bfloat16" }[] = [
  { id: "full-f32", label: "a full conversion, float32 model specs", options: {}, model: "float32" },
  { id: "full-bf16", label: "a full conversion, bfloat16 model specs", options: {}, model: "bfloat16" },
  { id: "params-f32", label: "--params-only, float32 model specs", options: { paramsOnly: true }, model: "float32" },
  { id: "params-bf16", label: "--params-only, bfloat16 model specs", options: { paramsOnly: true }, model: "bfloat16" },
  {
    id: "params-cast-bf16",
    label: "--params-only --dtype bfloat16, bfloat16 model specs (bit-equal to casting the source)",
    options: { paramsOnly: true, dtype: "bfloat16" },
    model: "bfloat16",
  },
  {
    id: "params-cast-f32",
    label: "--params-only --dtype bfloat16, float32 model specs (the bfloat16 values widened)",
    options: { paramsOnly: true, dtype: "bfloat16" },
    model: "float32",
  },
  { id: "cast-bf16", label: "--dtype bfloat16, bfloat16 model specs", options: { dtype: "bfloat16" }, model: "bfloat16" },
];

beforeAll(async () => {
  if (unavailable !== undefined) return;
  const cases: RestoreCase[] = [{ name: "axlearn-sample", root: join(SAMPLE, ".."), step: 100, mode: "trainer", source_index: SAMPLE }];
  for (const c of TRAINER_CASES) {
    await convertWith(c.location, join(out, "full", c.id));
    // The emergency fixture's index lists a tf.data iterator whose files it does not hold (its generator has no
    // tensorflow): a state of arrays alone is a subset, so CONTAINS_STATE.
    const validation = c.id === "emergency" ? "CONTAINS_STATE" : "EXACT";
    cases.push({ name: `full:${c.id}`, root: join(out, "full", c.id), mode: "trainer", validation, ...source(c) });
  }
  // The two-process step restored on two jax.distributed processes: each reads its own python_<i>.
  const mp = fixtureCase("multiprocess-iterators");
  cases.push({ name: "two-processes", root: join(out, "full", mp.id), mode: "trainer", processes: 2, ...source(mp) });
  for (const c of CAST_CASES) {
    await convertWith(c.location, join(out, "cast", c.id), { dtype: "bfloat16" });
    cases.push({ name: `cast:${c.id}`, root: join(out, "cast", c.id), mode: "trainer", cast: "bfloat16", ...source(c) });
    // Every cast chunk streamed (the path of chunks over CAST_WHOLE_MAX), whatever its size.
    await convertWith(c.location, join(out, "cast-streamed", c.id), { dtype: "bfloat16", castWholeMax: 0 });
    cases.push({ name: `cast-streamed:${c.id}`, root: join(out, "cast-streamed", c.id), mode: "trainer", cast: "bfloat16", ...source(c) });
  }
  for (const e of EXPORTS) {
    const root = join(out, "exports", e.id);
    await convertWith(tiny.location, root, e.options);
    cases.push({
      name: `export:${e.id}`,
      root,
      mode: "inference",
      model_dtype: e.model,
      ...(e.options.dtype ? { cast: e.options.dtype } : {}),
      ...source(tiny),
    });
  }
  results = axlearnRestore(cases);
}, 900_000);

describe(`AXLearn's Checkpointer.restore, validation EXACT${skipName}`, () => {
  test("restores AXLearn's own sample checkpoint (a control for the harness)", (ctx) => {
    if (unavailable !== undefined) ctx.skip();
    const r = results.get("axlearn-sample");
    expect(r?.problems).toEqual([]);
    expect(r).toMatchObject({ step: 100, arrays: 4, small: { "learner/optimizer/count": 42, prng_key: [0, 42, 7, 0xdeadbeef] } });
  });

  test.for(TRAINER_CASES)("restores the conversion of $label, every array bit-exact", (c, ctx) => {
    if (unavailable !== undefined) ctx.skip();
    const r = results.get(`full:${c.id}`);
    expect(r?.problems).toEqual([]);
    expect(r?.step).toBe(Number(c.stepDir.slice(-8)));
    expect(r?.validation).toBe(c.id === "emergency" ? "CONTAINS_STATE" : "EXACT");
    expect(r?.arrays).toBeGreaterThan(0);
    expect(r?.matched).toBe(r?.arrays);
  });

  test.for(["iterators", "multiprocess-iterators"])(
    "restores the python iterator of %s through AXLearn's PythonSavable restore, equal to the source's state",
    (id, ctx) => {
      if (unavailable !== undefined) ctx.skip();
      expect(results.get(`full:${id}`)?.iterators).toEqual({ input_iter: true });
    },
  );

  test("restores the two-process step on two processes: each process gets its own iterator's state, every array bit-exact", (ctx) => {
    if (unavailable !== undefined) ctx.skip();
    const r = results.get("two-processes");
    expect(r?.problems).toEqual([]);
    expect(r?.processes?.map((p) => [p.process, p.validation, p.matched === p.arrays, p.iterators])).toEqual([
      [0, "EXACT", true, { input_iter: true }],
      [1, "EXACT", true, { input_iter: true }],
    ]);
  });

  test.for(CAST_CASES)(
    "restores --dtype bfloat16 of $label with the source's specs cast to bfloat16, bit-equal to jnp's cast",
    (c, ctx) => {
      if (unavailable !== undefined) ctx.skip();
      const r = results.get(`cast:${c.id}`);
      expect(r?.problems).toEqual([]);
      expect(r?.validation).toBe("EXACT");
      expect(r?.matched).toBe(r?.arrays);
      expect(Object.values(r?.dtypes ?? {})).not.toContain("float32");
      expect(Object.values(r?.dtypes ?? {})).not.toContain("float64");
    },
  );

  test.for(CAST_CASES)("restores --dtype bfloat16 of $label with every cast chunk streamed, bit-equal to jnp's cast", (c, ctx) => {
    if (unavailable !== undefined) ctx.skip();
    const r = results.get(`cast-streamed:${c.id}`);
    expect(r?.problems).toEqual([]);
    expect(r?.validation).toBe("EXACT");
    expect(r?.matched).toBe(r?.arrays);
    expect(r?.arrays).toBe(results.get(`cast:${c.id}`)?.arrays);
  });
});

describe(`InferenceRunner's default builder (TensorStoreStateStorageBuilder, CONTAINS_STATE_UP_TO_DTYPE)${skipName}`, () => {
  test.for(EXPORTS)("restores $label: prng_key and every model leaf", (e, ctx) => {
    if (unavailable !== undefined) ctx.skip();
    const r = results.get(`export:${e.id}`);
    expect(r?.problems).toEqual([]);
    expect(r?.validation).toBe("CONTAINS_STATE_UP_TO_DTYPE");
    expect(r?.arrays).toBe(5);
    expect(r?.matched).toBe(5);
    expect(r?.dtypes?.prng_key).toBe("uint32");
    expect(r?.dtypes?.["model/decoder/emb/token_emb/weight"]).toBe(e.model);
  });
});
