// Every real Orbax fixture converts, and the result is what AXLearn's regular checkpointer would have
// written: checked by an independent Python reader (tensorstore, exactly as AXLearn's restore opens the
// arrays, against the source read by orbax) and by AXLearn's structure check re-implemented here.
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { verify } from "../../src/convert/verify.js";
import { parseIndex, structureStrings } from "../../src/regular/index-file.js";
import { runCli } from "../helpers/cli.js";
import {
  axlearnStructure,
  axlearnZarray,
  type CheckSummary,
  checkRegular,
  convertWith,
  FIXTURE_CASES,
  type FixtureCase,
  fixtureCase,
  readIndex,
  removeScratch,
  SAMPLE,
  scratch,
  sha256,
  UPSTREAM,
  WORK_DIR,
  zarrays,
} from "../helpers/convert.js";
import { UPSTREAM_NON_CRITICAL } from "../helpers/paths.js";

afterAll(removeScratch);

/** Orbax's own compatibility checkpoints with metadata that is not needed for the data removed. */
const UPSTREAM_VARIANTS = [
  "checkpoint_metadata_missing/pytree_checkpointable_has_metadata",
  "checkpoint_metadata_missing/pytree_checkpointable_missing_metadata",
  "checkpoint_metadata_present/pytree_checkpointable_missing_metadata",
  ...UPSTREAM_NON_CRITICAL,
].map((variant) => ({ variant, location: `${UPSTREAM}/${variant}`, hasMetadata: existsSync(`${UPSTREAM}/${variant}/state/_METADATA`) }));

const out = scratch("fixtures");
const stepOf = (c: FixtureCase) => join(out, c.id, c.stepDir);
const failures = new Map<string, string>();
let checks = new Map<string, CheckSummary>();

async function convertCase(c: FixtureCase): Promise<void> {
  const dest = join(out, c.id);
  if (c.viaCli) {
    const r = await runCli(["convert", c.location, dest, "--json", ...(c.step === undefined ? [] : ["--step", String(c.step)])]);
    if (r.code !== 0) throw new Error(`exit ${r.code}: ${r.stderr}`);
  } else {
    await convertWith(c.location, dest, c.step === undefined ? {} : { step: c.step });
  }
}

beforeAll(async () => {
  for (const c of FIXTURE_CASES) {
    try {
      await convertCase(c);
    } catch (e) {
      failures.set(c.id, String((e as Error).stack ?? e));
    }
  }
  for (const u of UPSTREAM_VARIANTS) {
    try {
      await convertWith(u.location, join(out, u.variant), { step: 1 });
    } catch (e) {
      failures.set(u.variant, String((e as Error).stack ?? e));
    }
  }
  checks = checkRegular([
    ...FIXTURE_CASES.filter((c) => !failures.has(c.id)).map((c) => ({
      name: c.id,
      regular: stepOf(c),
      source_item: c.item,
      ...(c.index === undefined ? {} : { source_index: c.index }),
    })),
    ...UPSTREAM_VARIANTS.filter((u) => !failures.has(u.variant)).map((u) => ({
      name: u.variant,
      regular: join(out, u.variant, "step_00000001"),
      source_item: `${u.location}/state`,
      orbax: u.hasMetadata,
    })),
  ]);
}, 180_000);

const check = (c: FixtureCase | string): CheckSummary => {
  const name = typeof c === "string" ? c : c.id;
  const s = checks.get(name);
  if (s === undefined) throw new Error(`no checker result for ${name}`);
  return s;
};

/** The AXLearn sample's `.zarray` files, keyed by dtype/shape/chunks. */
function sampleZarrays(): Map<string, string> {
  const out = new Map<string, string>();
  for (const data of zarrays(SAMPLE).values()) {
    const z = JSON.parse(data.toString());
    out.set(JSON.stringify([z.dtype, z.shape, z.chunks]), data.toString());
  }
  return out;
}

describe.each(FIXTURE_CASES)("$label", (c) => {
  test(`converts (${c.viaCli ? "CLI" : "convert() API"}) and commits an index`, () => {
    expect(failures.get(c.id)).toBeUndefined();
    expect(existsSync(join(stepOf(c), "index"))).toBe(true);
  });

  // A source whose directory does not name its step (converted with --step 7) is verified against the step
  // the regular directory's name gives (src/convert/verify.ts: `source.step ?? parseStepName(<dest dir>)`).
  test("orbax2reg verify passes on the result", async () => {
    const r = await verify(c.location, stepOf(c));
    expect(r.checks.filter((x) => !x.ok)).toEqual([]);
    expect(r.failed).toBe(0);
  });

  test("every array reads back through tensorstore's zarr driver (as AXLearn restores it) bit-exactly equal to the source", () => {
    const s = check(c);
    expect(s.problems).toEqual([]);
    expect(s.arrays).toBeGreaterThan(0);
    expect(s.arrays_matched).toBe(s.arrays);
    expect(s.chunk_files).toBeGreaterThanOrEqual(s.arrays as number);
  });

  test("orbax's own restore of the source agrees with the tensorstore/OCDBT read the comparison used", () => {
    const s = check(c);
    expect(s.orbax_agrees_with_tensorstore).toBe(true);
    expect(s.source_arrays_orbax).toBe(s.arrays);
  });

  if (c.expected !== undefined)
    test("holds every array expected.json lists, with its dtype and shape", () => {
      const expected = JSON.parse(readFileSync(c.expected as string, "utf8")) as Record<string, { dtype: string; shape: number[] }>;
      const index = readIndex(join(stepOf(c), "index"));
      const arrays = Object.fromEntries(index.filter(([, v]) => typeof v === "object" && v !== null));
      expect(Object.keys(arrays).sort()).toEqual(Object.keys(expected).sort());
      for (const [path, e] of Object.entries(expected)) {
        const shape = e.shape.length === 1 ? `(${e.shape[0]},)` : `(${e.shape.join(", ")})`;
        expect(arrays[path]).toEqual({ dtype: e.dtype, shape });
      }
      expect(check(c).arrays).toBe(Object.keys(expected).length);
    });

  test('the index starts with ["step", N], N the integer step of the directory name', () => {
    const text = readFileSync(join(stepOf(c), "index"), "utf8");
    const index = readIndex(join(stepOf(c), "index"));
    expect(index[0]).toEqual(["step", Number(c.stepDir.slice(-8))]);
    expect(text.startsWith(`[["step", ${Number(c.stepDir.slice(-8))}], `)).toBe(true);
    expect(check(c).step).toBe(Number(c.stepDir.slice(-8)));
  });

  test("every array entry of the index is a dict with exactly the keys dtype then shape", () => {
    const arrays = readIndex(join(stepOf(c), "index")).filter(([, v]) => typeof v === "object" && v !== null);
    expect(arrays.length).toBeGreaterThan(0);
    for (const [, v] of arrays) expect(Object.keys(v as object)).toEqual(["dtype", "shape"]);
  });

  test("the structure strings computed here are the ones Python computes (validates the re-implementation)", () => {
    expect(axlearnStructure(readIndex(join(stepOf(c), "index")))).toEqual(check(c).structure);
  });

  if (c.index !== undefined)
    test("the index passes AXLearn's EXACT structure check against the source index", () => {
      const converted = axlearnStructure(readIndex(join(stepOf(c), "index")));
      expect(converted).toEqual(axlearnStructure(readIndex(c.index as string)));
      expect(check(c).structure_exact_vs_source_index).toBe(true);
    });

  test("the index passes AXLearn's EXACT structure check against the index built from the restored source arrays", () => {
    expect(check(c).structure_exact_vs_restored_arrays).toBe(true);
  });

  if (c.index !== undefined)
    test("the index is the source's index file byte for byte", () => {
      expect(readFileSync(join(stepOf(c), "index")).equals(readFileSync(c.index as string))).toBe(true);
    });

  if (c.index === undefined)
    test("without an index in the source, the index is what AXLearn's save writes for these arrays", () => {
      expect(check(c).index_bytes_equal_axlearn_save).toBe(true);
    });

  test("every .zarray has exactly the form AXLearn writes (compact, sorted keys, zstd level 1, fill_value null)", () => {
    const all = zarrays(stepOf(c));
    expect(all.size).toBe(check(c).arrays);
    for (const [path, data] of all) {
      const z = JSON.parse(data.toString());
      expect({ path, zarray: data.toString() }).toEqual({ path, zarray: axlearnZarray(z) });
    }
    expect(check(c).zarray_axlearn_form).toBe(all.size);
  });

  if (c.zarrFormat === 2)
    test("zarr v2 source: every .zarray is the source's .zarray byte for byte", () => {
      expect(check(c).zarray_identical_to_source).toBe(check(c).arrays);
    });

  test("a .zarray for the same dtype, shape and chunks as one in AXLearn's own sample is byte-identical to it", () => {
    const sample = sampleZarrays();
    for (const data of zarrays(stepOf(c)).values()) {
      const z = JSON.parse(data.toString());
      const same = sample.get(JSON.stringify([z.dtype, z.shape, z.chunks]));
      if (same !== undefined) expect(data.toString()).toBe(same);
    }
  });

  test("the step holds only gda/, the index, iterator files and the tool's work directory", () => {
    const top = readdirSync(stepOf(c)).sort();
    for (const name of top) expect(name).toMatch(new RegExp(`^(gda|index|python_\\d+|tf_\\d+|${WORK_DIR.replace(".", "\\.")})$`));
    expect(top).toContain("gda");
    expect(top).toContain("index");
  });
});

describe.each(UPSTREAM_VARIANTS)("Orbax's own checkpoint $variant", (u) => {
  test("converts (--step 1)", () => {
    expect(failures.get(u.variant)).toBeUndefined();
    expect(existsSync(join(out, u.variant, "step_00000001/index"))).toBe(true);
  });

  test("both arrays read back through tensorstore's zarr driver bit-exactly equal to the source", () => {
    expect(check(u.variant).problems).toEqual([]);
    expect(check(u.variant).arrays_matched).toBe(2);
  });

  test("the index is exactly what AXLearn's save writes for the two arrays", () => {
    expect(readFileSync(join(out, u.variant, "step_00000001/index"), "utf8")).toBe(
      '[["step", 1], ["a", {"dtype": "int32", "shape": "(8,)"}], ["b/c", {"dtype": "int32", "shape": "(3,)"}]]',
    );
    if (u.hasMetadata) expect(check(u.variant).index_bytes_equal_axlearn_save).toBe(true);
  });
});

describe("orbax2reg's own structure strings", () => {
  test("structureStrings renders index entries without string values exactly as AXLearn's check does", () => {
    const c = fixtureCase("tiny");
    const { step, entries } = parseIndex(readFileSync(join(stepOf(c), "index"), "utf8"), "index");
    expect(structureStrings(step, entries)).toEqual(check(c).structure);
  });

  // AXLearn builds f"{path}={value}", i.e. str(value): a string value appears without quotes
  // ("input_iter=<class '...'>"). structureStrings() (src/regular/index-file.ts) does the same, so verify's
  // diff lines are the strings AXLearn would show.
  test("structureStrings renders an iterator's string entry exactly as AXLearn's check does", () => {
    const c = fixtureCase("iterators");
    const { step, entries } = parseIndex(readFileSync(join(stepOf(c), "index"), "utf8"), "index");
    expect(structureStrings(step, entries)).toEqual(check(c).structure);
  });
});

describe("AXLearn's sample .zarray forms appear in converted checkpoints", () => {
  test("the tiny AXLearn tree converts prng_key and an optimizer count to the sample's exact .zarray bytes", () => {
    for (const id of ["tiny", "shared-zarr3"]) {
      const got = zarrays(stepOf(fixtureCase(id)));
      expect(got.get("prng_key")?.toString()).toBe(readFileSync(join(SAMPLE, "gda/prng_key/.zarray"), "utf8"));
      expect(got.get("learner/optimizer/0/count")?.toString()).toBe(
        readFileSync(join(SAMPLE, "gda/learner/optimizer/count/.zarray"), "utf8"),
      );
    }
  });
});

describe("iterator files", () => {
  const iterators = fixtureCase("iterators");
  const emergency = fixtureCase("emergency");

  test("python/python_0/input_iter is copied to python_0/input_iter byte for byte", () => {
    const expected = JSON.parse(readFileSync("test/.generated/fixtures/iterators/expected_files.json", "utf8"));
    const copied = readFileSync(join(stepOf(iterators), "python_0/input_iter"));
    expect(sha256(copied)).toBe(expected["step_00000100/python/python_0/input_iter"].sha256);
    expect(copied.equals(readFileSync(`${iterators.location}/python/python_0/input_iter`))).toBe(true);
  });

  test("the iterators index keeps the input_iter entry AXLearn wrote", () => {
    const index = readIndex(join(stepOf(iterators), "index"));
    expect(index).toContainEqual(["input_iter", "<class 'fixtures_gen.FakeGrainIterator'>"]);
  });

  test("the emergency checkpoint's index is non-tensors/step_00000100/index byte for byte", () => {
    const expected = JSON.parse(readFileSync("test/.generated/fixtures/emergency/expected_files.json", "utf8"));
    expect(sha256(readFileSync(join(stepOf(emergency), "index")))).toBe(expected["non-tensors/step_00000100/index"].sha256);
  });

  test("the emergency checkpoint converts from its tensors/step_X directory as well, to the same bytes", async () => {
    const dest = scratch("emergency-step");
    await convertWith(`${emergency.location}/tensors/step_00000100`, dest);
    const a = readFileSync(join(dest, "step_00000100/index"));
    expect(a.equals(readFileSync(join(stepOf(emergency), "index")))).toBe(true);
    for (const [path, data] of zarrays(join(dest, "step_00000100"))) {
      expect(data.equals(zarrays(stepOf(emergency)).get(path) as Buffer)).toBe(true);
    }
  });
});
