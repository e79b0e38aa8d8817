// `--dtype bfloat16`: float32/float64 leaves are decoded, cast (src/zarr/cast.ts) and encoded as AXLearn's regular
// writer encodes a bfloat16 array; everything else is copied chunk for chunk. AXLearn's own restore of these exports
// is in axlearn.test.ts; the cast itself against jnp in test/zarr/cast.test.ts.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { compress, decompressBounded } from "../../src/codecs/zstd.js";
import { HANDLERS, type Run } from "../../src/convert/transforms.js";
import { verify } from "../../src/convert/verify.js";
import { parseZarrMetadata } from "../../src/zarr/metadata.js";
import { runCli } from "../helpers/cli.js";
import {
  axlearnZarray,
  convertWith,
  fixtureCase,
  planOnDisk,
  readIndex,
  removeScratch,
  SAMPLE,
  scratch,
  snapshot,
  zarrays,
} from "../helpers/convert.js";

afterAll(removeScratch);

const dtypes = fixtureCase("shared-dtypes");
const nofill = fixtureCase("zarr3-nofill");
const out = scratch("cast");
const full = join(out, "full", dtypes.stepDir);
const cast = join(out, "cast", dtypes.stepDir);
const sourceIndex = readIndex(dtypes.index as string);
const isWideFloat = (dtype: unknown) => dtype === "float32" || dtype === "float64";

beforeAll(async () => {
  await convertWith(dtypes.location, join(out, "full"));
  expect((await runCli(["convert", dtypes.location, join(out, "cast"), "--dtype", "bfloat16"])).code).toBe(0);
}, 120_000);

describe("--dtype bfloat16", () => {
  test("the index names bfloat16 for every float32/float64 array, and is otherwise the source's index, in its order", () => {
    const want = sourceIndex.map(([p, v]) => {
      const value = v as { dtype?: string; shape?: string };
      return [p, typeof v === "object" && isWideFloat(value.dtype) ? { dtype: "bfloat16", shape: value.shape } : v];
    });
    expect(readIndex(join(cast, "index"))).toEqual(want);
    expect(JSON.stringify(want)).toContain("float16"); // the fixture has 16-bit floats, which stay as they are
  });

  test("each cast array's .zarray is what AXLearn's writer writes for a bfloat16 array: dtype bfloat16, zstd level 1", () => {
    const z = zarrays(cast);
    const src = zarrays(full);
    let castArrays = 0;
    for (const [path, bytes] of z) {
      const before = JSON.parse((src.get(path) as Buffer).toString());
      if (!isWideFloat(parseZarrMetadata(".zarray", src.get(path) as Buffer, { path }).dtype.name)) continue;
      castArrays++;
      expect(bytes.toString()).toBe(axlearnZarray({ dtype: "bfloat16", shape: before.shape, chunks: before.chunks }));
    }
    expect(castArrays).toBeGreaterThan(0);
  });

  test("integer, bool and 16-bit leaves pass through: their .zarray and every chunk file byte for byte as a full conversion's", () => {
    const mine = snapshot(join(cast, "gda"));
    const theirs = snapshot(join(full, "gda"));
    const kept = sourceIndex.filter(([, v]) => typeof v === "object" && !isWideFloat((v as { dtype: string }).dtype)).map(([p]) => p);
    expect(kept.length).toBeGreaterThan(3);
    for (const path of kept) {
      const files = [...theirs.keys()].filter((k) => k.startsWith(`${path}/`));
      expect(files.length).toBeGreaterThan(1);
      for (const f of files) expect(mine.get(f)?.equals(theirs.get(f) as Buffer), f).toBe(true);
    }
  });

  test("the plan copies the passed-through chunks and casts only the float32/float64 ones", () => {
    const plan = planOnDisk(cast);
    expect(plan.options).toEqual({ paramsOnly: false, dtype: "bfloat16" });
    const castArrays = new Set(plan.arrays.flatMap((a, i) => (a.castTo === "bfloat16" ? [i] : [])));
    expect(plan.arrays.filter((a) => a.castTo !== undefined).map((a) => a.dtype)).toSatisfy((d: string[]) => d.every(isWideFloat));
    for (const o of plan.objects) {
      if (o.target.endsWith("/.zarray")) continue;
      expect(o.transform === "cast", o.target).toBe(o.array !== undefined && castArrays.has(o.array));
    }
  });

  test("verify checks the export against the cast of its source and passes", async () => {
    const r = await verify(dtypes.location, cast);
    expect(r.checks.filter((c) => !c.ok)).toEqual([]);
    expect(r.checks.some((c) => c.name.endsWith("(cast to bfloat16)"))).toBe(true);
  });

  test("verify fails a cast chunk that holds the source's values truncated instead of rounded", async () => {
    const copy = join(scratch("cast-damaged"), dtypes.stepDir);
    for (const [rel, bytes] of snapshot(cast, () => true)) {
      const p = join(copy, rel);
      (await import("node:fs")).mkdirSync(join(p, ".."), { recursive: true });
      writeFileSync(p, bytes);
    }
    const path = (sourceIndex.find(([, v]) => (v as { dtype?: string }).dtype === "float32") as [string, unknown])[0];
    const z = parseZarrMetadata(".zarray", readFileSync(join(full, "gda", path, ".zarray")), { path });
    const key = z.shape.length === 0 ? "0" : z.shape.map(() => "0").join(".");
    const source = decompressBounded(readFileSync(join(full, "gda", path, key)), 1 << 26, key);
    const truncated = new Uint16Array(source.length / z.dtype.itemSize);
    const view = new DataView(source.buffer, source.byteOffset, source.length);
    for (let i = 0; i < truncated.length; i++) {
      truncated[i] = view.getUint32(i * 4, true) >>> 16;
    }
    writeFileSync(join(copy, "gda", path, key), compress(new Uint8Array(truncated.buffer)));
    const r = await verify(dtypes.location, copy);
    expect(r.checks.filter((c) => !c.ok).map((c) => c.detail)).toEqual([expect.stringMatching(/differs from the source cast to bfloat16/)]);
  });

  test("chunks the source leaves out (equal to the fill value) are written as the cast fill value", async () => {
    const dest = join(scratch("cast-nofill"), "out");
    await convertWith(nofill.location, dest, { dtype: "bfloat16" });
    const plan = planOnDisk(join(dest, nofill.stepDir));
    expect(plan.objects.some((o) => o.transform === "fill" && plan.arrays[o.array as number]?.castTo === "bfloat16")).toBe(true);
    const r = await verify(nofill.location, join(dest, nofill.stepDir));
    expect(r.checks.filter((c) => !c.ok)).toEqual([]);
  });
});

describe("the cast chunk's encoding", () => {
  test("is byte for byte what TensorStore wrote for AXLearn's own bfloat16 array (zstd level 1)", () => {
    for (const key of ["0.0", "0.1"]) {
      const stored = readFileSync(join(SAMPLE, "gda/model/linear/bias", key));
      expect(Buffer.from(compress(decompressBounded(stored, 1 << 20, key))).equals(stored)).toBe(true);
    }
  });

  test("a cast object's memory weight counts the stored chunk, its elements, the bfloat16 elements and their frame", () => {
    const meta = parseZarrMetadata(".zarray", Buffer.from(axlearnZarray({ dtype: "<f4", shape: [1024, 1024], chunks: [512, 1024] })), {
      path: "test",
    });
    const run = { meta: () => meta, castTo: () => "bfloat16" } as unknown as Run;
    const job = HANDLERS.cast(run, {
      target: "gda/w/0.0",
      data: { kind: "range", key: "k", offset: 0, length: 1000 },
      transform: "cast",
      array: 0,
      size: null,
    });
    const elements = 512 * 1024;
    expect(job.weight).toBe(1000 + elements * 4 + 2 * elements * 2);
  });
});
