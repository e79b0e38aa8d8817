// The export's sources: a zstd chunk read whole (small) or a window at a time (large) gives the same bytes and
// the same refusals.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { FormatError } from "../../src/errors.js";
import { openExportSource, WHOLE_CHUNK_BYTES } from "../../src/hf/source.js";
import { castToBfloat16 } from "../../src/zarr/cast.js";
import { DTYPES } from "../../src/zarr/dtype.js";
import { tempDir } from "../helpers/tmp.js";
import { chunkOf, type HostArray, writeRegularStep } from "./fuji-tree.js";

/** A float32 array of `rows` x 1024 (4 KiB a row) with distinct values, in one chunk. */
function array(path: string, rows: number): HostArray {
  const data = new Float32Array(rows * 1024);
  for (let i = 0; i < data.length; i++) data[i] = Math.sin(i) * 1000;
  return { path, shape: [rows, 1024], data };
}

async function chunkBytes(dir: string, path: string, bf16 = false): Promise<Uint8Array> {
  const source = await openExportSource(dir);
  const a = source.arrays.find((x) => x.path === path);
  if (a === undefined) throw new Error(`no ${path}`);
  const pieces: Uint8Array[] = [];
  for await (const piece of a.chunk([0, 0], 64 << 10, bf16)) pieces.push(piece);
  return Buffer.concat(pieces);
}

describe("a zstd chunk of the source", () => {
  const small = array("small", WHOLE_CHUNK_BYTES / 4096); // 1 MiB decoded: read and decoded whole
  const large = array("large", WHOLE_CHUNK_BYTES / 4096 + 1); // 4 KiB more: streamed
  const dir = tempDir("hf-source");
  writeRegularStep(dir, [small, large], (a) => [...a.shape]);

  for (const a of [small, large])
    test(`${a === small ? "of at most WHOLE_CHUNK_BYTES, read whole" : "larger, streamed"}: its decoded bytes, C order`, async () => {
      const bytes = await chunkBytes(dir, a.path);
      expect(Buffer.compare(bytes, chunkOf(a, a.shape, [0, 0]))).toBe(0);
    });

  test("says which arrays' chunks are decoded whole (what an open one holds: its bytes, not a decoder)", async () => {
    const source = await openExportSource(dir);
    expect(source.arrays.map((a) => [a.path, a.wholeChunks])).toEqual([
      ["small", true],
      ["large", false],
    ]);
  });

  test("a float32 chunk decoded whole is read cast to bfloat16 as asked: the bits zarr/cast.ts gives", async () => {
    const source = await openExportSource(dir);
    expect(source.arrays.map((a) => [a.path, a.castsToBf16])).toEqual([
      ["small", true],
      ["large", false],
    ]);
    const float32 = DTYPES.find((d) => d.name === "float32");
    if (float32 === undefined) throw new Error("no float32");
    const bytes = await chunkBytes(dir, small.path, true);
    expect(Buffer.compare(bytes, castToBfloat16(chunkOf(small, small.shape, [0, 0]), float32))).toBe(0);
  });

  test("many small chunks read at once, through buffers reused from read to read, each decode to their own bytes", async () => {
    const rows = array("rows", 300); // 300 chunks of one row: more than the reads let out at once
    const many = tempDir("hf-source-many");
    writeRegularStep(many, [rows], () => [1, 1024]);
    const source = await openExportSource(many);
    const a = source.arrays[0];
    const chunks = await Promise.all(
      Array.from({ length: 300 }, async (_, r) => {
        const pieces: Uint8Array[] = [];
        for await (const piece of a?.chunk([r, 0]) ?? []) pieces.push(piece);
        return Buffer.concat(pieces);
      }),
    );
    expect(chunks.map((bytes, r) => Buffer.compare(bytes, chunkOf(rows, [1, 1024], [r, 0])))).toEqual(chunks.map(() => 0));
  });

  for (const [what, damage, message] of [
    ["truncated", (b: Buffer) => b.subarray(0, b.length - 100), /truncated zstd frame/],
    ["followed by other bytes", (b: Buffer) => Buffer.concat([b, Buffer.from([1, 2, 3])]), /bytes follow the zstd frame/],
  ] as const)
    for (const a of [small, large])
      test(`${what}, ${a === small ? "read whole" : "streamed"}: a FormatError naming the chunk's file`, async () => {
        const broken = tempDir("hf-source-broken");
        writeRegularStep(broken, [a], (x) => [...x.shape]);
        const file = join(broken, "gda", a.path, "0.0");
        writeFileSync(file, damage(readFileSync(file)));
        const failure = await chunkBytes(broken, a.path).catch((e: unknown) => e);
        expect(failure).toBeInstanceOf(FormatError);
        expect((failure as FormatError).message).toMatch(message);
        expect(String((failure as FormatError).path)).toContain(join(a.path, "0.0"));
      });
});
