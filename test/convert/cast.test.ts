// `--dtype bfloat16`: float32/float64 leaves are decoded, cast (src/zarr/cast.ts) and encoded as AXLearn's regular
// writer encodes a bfloat16 array; everything else is copied chunk for chunk. AXLearn's own restore of these exports
// is in axlearn.test.ts; the cast itself against jnp in test/zarr/cast.test.ts.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { compress, decodeChunkFrame, decompressBounded } from "../../src/codecs/zstd.js";
import { castStream, HANDLERS, type Run } from "../../src/convert/transforms.js";
import { verify } from "../../src/convert/verify.js";
import { castToBfloat16 } from "../../src/zarr/cast.js";
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

describe("a chunk larger than the whole-cast limit is streamed", () => {
  const f32 = (shape: number[], compressor: boolean) =>
    parseZarrMetadata(
      ".zarray",
      Buffer.from(
        JSON.stringify({
          ...JSON.parse(axlearnZarray({ dtype: "<f4", shape, chunks: shape })),
          compressor: compressor ? { id: "zstd", level: 1 } : null,
        }),
      ),
      { path: "test" },
    );
  /** float32 elements with every rounding case (ties, NaN, infinities, subnormals) among ordinary values. */
  const elementsOf = (n: number) => {
    const bits = new Uint32Array(n);
    const special = [0x3f808000, 0x3f818000, 0x7fc00001, 0xff800000, 0x7f800000, 0x00000001, 0x80000000, 0x7f7fffff];
    for (let i = 0; i < n; i++)
      bits[i] = i % 97 === 0 ? (special[(i / 97) % special.length] as number) : Math.floor(Math.sin(i) * 2 ** 31) >>> 0;
    return new Uint8Array(bits.buffer);
  };
  async function* piecesOf(bytes: Uint8Array, size: number) {
    for (let at = 0; at < bytes.length; at += size) yield bytes.subarray(at, at + size);
  }
  const collect = async (s: AsyncIterable<Uint8Array>) => {
    const parts: Uint8Array[] = [];
    for await (const p of s) parts.push(p);
    return Buffer.concat(parts);
  };

  test("it decodes to the whole-chunk cast's bytes, one frame whose header is compress()'s, across odd piece boundaries", async () => {
    const elements = elementsOf(3 << 18); // 3 MiB of float32
    const whole = compress(castToBfloat16(elements, f32([3 << 18], true).dtype));
    for (const compressed of [true, false]) {
      const stored = compressed ? compress(elements) : elements;
      const frame = await collect(castStream(piecesOf(stored, 1001), f32([3 << 18], compressed), elements.length, "test"));
      expect(
        Buffer.from(decodeChunkFrame(frame, 3 << 19, "test")).equals(Buffer.from(castToBfloat16(elements, f32([1], true).dtype))),
      ).toBe(true);
      expect(frame.subarray(0, 6).equals(Buffer.from(whole.subarray(0, 6)))).toBe(true);
    }
  });

  test("a stored chunk that is not one frame of the chunk's size fails as a FormatError", async () => {
    const elements = elementsOf(1 << 16);
    const stored = compress(elements);
    const meta = f32([1 << 16], true);
    await expect(collect(castStream(piecesOf(stored.subarray(0, stored.length - 5), 4096), meta, elements.length, "k"))).rejects.toThrow(
      /truncated zstd frame/,
    );
    await expect(collect(castStream(piecesOf(Buffer.concat([stored, stored]), 4096), meta, elements.length, "k"))).rejects.toThrow(
      /bytes follow the zstd frame/,
    );
  });

  test("its memory weight is a streamed copy's plus the coders' state, whatever the chunk's size, and it reads the chunk as a stream", async () => {
    const weights = new Set<number>();
    for (const n of [1 << 20, 1 << 24, 200 << 20]) {
      const meta = f32([n], true);
      const reads: string[] = [];
      const source = {
        readStream: (_k: string, _o: number, length: number) => {
          reads.push(`stream ${length}`);
          return piecesOf(compress(elementsOf(1 << 20)), 65536);
        },
        readRange: () => Promise.reject(new Error("read whole")),
        url: "mem://",
      };
      const run = { source, meta: () => meta, castTo: () => "bfloat16", streamReserve: 4 << 20, castWholeMax: 1 << 19 } as unknown as Run;
      const job = HANDLERS.cast(run, {
        target: "gda/w/0",
        data: { kind: "range", key: "k", offset: 0, length: 1234 },
        transform: "cast",
        array: 0,
        size: null,
      });
      weights.add(job.weight);
      if (n !== 1 << 20) continue;
      const out = await job.run();
      expect("data" in out && out.bytes).toBe(undefined);
      const frame = await collect((out as { data: AsyncIterable<Uint8Array> }).data);
      expect(reads).toEqual(["stream 1234"]);
      expect(decodeChunkFrame(frame, 1 << 21, "test").length).toBe(1 << 21);
    }
    expect([...weights]).toEqual([(4 << 20) + (4 << 20)]);
  });

  test("a conversion streaming every cast chunk writes chunks that decode to the whole-chunk conversion's, and verify passes", async () => {
    for (const fixture of [dtypes, nofill]) {
      const whole = scratch(`cast-whole-${fixture.stepDir}`);
      const root = scratch(`cast-streamed-${fixture.stepDir}`);
      await convertWith(fixture.location, whole, { dtype: "bfloat16" });
      await convertWith(fixture.location, root, { dtype: "bfloat16", castWholeMax: 0 });
      const streamed = join(root, fixture.stepDir);
      const mine = snapshot(join(streamed, "gda"));
      const theirs = snapshot(join(whole, fixture.stepDir, "gda"));
      expect([...mine.keys()].sort()).toEqual([...theirs.keys()].sort());
      let frames = 0;
      for (const [f, bytes] of theirs) {
        const other = mine.get(f) as Buffer;
        if (f.endsWith(".zarray") || bytes.length < 4 || bytes.readUInt32LE(0) !== 0xfd2fb528) expect(other.equals(bytes), f).toBe(true);
        else {
          frames++;
          expect(Buffer.from(decompressBounded(other, 1 << 30, f)).equals(Buffer.from(decompressBounded(bytes, 1 << 30, f))), f).toBe(true);
        }
      }
      expect(frames).toBeGreaterThan(0);
      const r = await verify(fixture.location, streamed);
      expect(r.checks.filter((c) => !c.ok)).toEqual([]);
    }
  });
});
