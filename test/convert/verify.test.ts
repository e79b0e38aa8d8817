// `verify` decodes every chunk as TensorStore reads it, and compares it with its source's: streamed as stored
// bytes where the conversion passed them through (a v2 chunk copied, or the inner chunk of an Orbax zarr3
// shard), decoded where the bytes differ. A changed chunk fails however it changed; an equal one re-encoded by
// another writer passes; one TensorStore cannot read fails even when it is its source's bytes.
import { readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { compress, decompressBounded } from "../../src/codecs/zstd.js";
import { verify } from "../../src/convert/verify.js";
import { firstDifference } from "../../src/util/streams.js";
import { convertWith, copyOf, fixtureCase, removeScratch, scratch } from "../helpers/convert.js";
import { directoryLayoutCopy } from "../helpers/directory-layout.js";
import { cat, zstdRleFrameWithoutSize } from "../helpers/ocdbt-encode.js";

afterAll(removeScratch);

async function* pieces(bytes: Uint8Array, cuts: number[]): AsyncIterable<Uint8Array> {
  let at = 0;
  for (const c of [...cuts, bytes.length]) {
    yield bytes.subarray(at, c);
    at = c;
  }
}

describe("firstDifference", () => {
  const bytes = new Uint8Array(1000).map((_, i) => i % 251);
  test("equal bytes cut into different pieces are equal", async () => {
    expect(await firstDifference(pieces(bytes, [1, 500, 500, 999]), pieces(bytes, [333, 334]))).toBeUndefined();
  });
  test("gives the offset of the first differing byte", async () => {
    const other = bytes.slice();
    other[617] = 0;
    expect(await firstDifference(pieces(bytes, [100, 700]), pieces(other, [616]))).toBe(617);
  });
  test("a stream that ends early differs where it ends", async () => {
    expect(await firstDifference(pieces(bytes, [10]), pieces(bytes.subarray(0, 640), [320]))).toBe(640);
  });
  test("stops reading both streams at the first difference", async () => {
    let returned = 0;
    async function* endless(): AsyncIterable<Uint8Array> {
      try {
        for (;;) yield new Uint8Array(16);
      } finally {
        returned++;
      }
    }
    expect(await firstDifference(endless(), pieces(new Uint8Array(40).fill(1), []))).toBe(0);
    expect(returned).toBe(1);
  });
});

// "large": zarr v2 chunks of several MB, copied as they are; "zarr3": Orbax zarr3 shards, whose inner chunk is kept.
describe.each(["large", "zarr3"])("verify of %s", (id) => {
  const c = fixtureCase(id);
  let converted = "";
  beforeAll(async () => {
    const root = scratch(`verify-${id}`);
    await convertWith(c.location, root);
    converted = join(root, c.stepDir);
  }, 120_000);

  /** A damaged copy of the conversion: `change` gets the biggest chunk's path (inside the copy) and its bytes. */
  function damaged(change: (path: string, bytes: Buffer) => void): string {
    const copy = copyOf(converted, `verify-${id}-damaged`);
    let biggest = { path: "", size: -1 };
    const walk = (dir: string) => {
      for (const e of readdirSync(dir, { withFileTypes: true })) {
        const p = join(dir, e.name);
        if (e.isDirectory()) walk(p);
        else if (e.name !== ".zarray") {
          const size = statSync(p).size;
          if (size > biggest.size) biggest = { path: p, size };
        }
      }
    };
    walk(join(copy, "gda"));
    change(biggest.path, readFileSync(biggest.path));
    return copy;
  }
  const failures = async (dir: string) => (await verify(c.location, dir)).checks.filter((x) => !x.ok);

  test("passes on the conversion", async () => {
    expect(await failures(converted)).toEqual([]);
  });

  test("passes a chunk re-encoded at another zstd level: other bytes, the same elements", async () => {
    const dir = damaged((p, b) => writeFileSync(p, compress(decompressBounded(b, 1 << 30, p), 19)));
    expect(await failures(dir)).toEqual([]);
  });

  test("fails a chunk whose elements changed, naming it", async () => {
    const dir = damaged((p, b) => {
      const elements = decompressBounded(b, 1 << 30, p);
      const at = elements.length >> 1;
      elements[at] = (elements[at] as number) ^ 0xff;
      writeFileSync(p, compress(elements));
    });
    const [failure, ...rest] = await failures(dir);
    expect(rest).toEqual([]);
    expect(failure?.detail).toMatch(/^chunk [\d.]+ differs from the source \(sha256 /);
  });

  test("fails a chunk one byte shorter than its source's", async () => {
    const dir = damaged((p, b) => writeFileSync(p, b.subarray(0, b.length - 1)));
    expect(await failures(dir)).toHaveLength(1);
  });

  test("fails a chunk stored as its source's bytes under a .zarray that says they are not compressed", async () => {
    const dir = damaged((p) => {
      const zarray = join(p, "..", ".zarray");
      writeFileSync(zarray, readFileSync(zarray, "utf8").replace(/"compressor": ?\{[^}]*\}/, '"compressor":null'));
    });
    const [failure] = await failures(dir);
    expect(failure?.detail).toMatch(/uncompressed chunk has \d+ bytes/);
  });
});

// The case: a source chunk TensorStore cannot read, which the conversion passes through as its source's
// bytes (as it should), so that only decoding it tells. The tiny step re-stored in the directory layout with its
// prng_key chunk (uint32[4]: 16 bytes) replaced, then converted.
describe("verify of a chunk stored as its source's bytes that TensorStore cannot read", () => {
  const tiny = fixtureCase("tiny");

  /** Converts the tiny step with prng_key/0 made from its elements by `frame`; verify's failures and seconds. */
  async function verifyWith(label: string, frame?: (elements: Uint8Array) => Uint8Array) {
    const source = await directoryLayoutCopy(tiny.location, `verify-${label}`);
    const chunk = join(source, "state/prng_key/0");
    if (frame !== undefined) writeFileSync(chunk, frame(decompressBounded(readFileSync(chunk), 16, chunk)));
    const root = scratch(`verify-${label}-out`);
    await convertWith(source, root);
    const started = performance.now();
    const result = await verify(source, join(root, tiny.stepDir));
    return { failures: result.checks.filter((x) => !x.ok), seconds: (performance.now() - started) / 1000 };
  }

  test("passes the unchanged step in the directory layout", async () => {
    expect((await verifyWith("control")).failures).toEqual([]);
  });

  test("fails a frame without a content size that inflates to 2 GiB, naming the chunk, after one block", async () => {
    const { failures, seconds } = await verifyWith("inflating", () => zstdRleFrameWithoutSize(0, 2 ** 31));
    expect(failures).toEqual([
      {
        name: "gda/prng_key",
        ok: false,
        detail:
          "chunk 0: the zstd frame decodes to more than the 16 bytes of the chunk's shape (stopped at byte 17); TensorStore cannot read it",
      },
    ]);
    expect(seconds).toBeLessThan(5);
  });

  test("fails a truncated frame", async () => {
    const { failures } = await verifyWith("truncated", (e) => compress(e).subarray(0, -1));
    expect(failures.map((f) => f.detail)).toEqual([
      expect.stringMatching(/^chunk 0: truncated zstd frame: the chunk ends after \d+ bytes/),
    ]);
  });

  test("fails bytes after the frame (TensorStore: End of data expected)", async () => {
    const { failures } = await verifyWith("trailing", (e) => cat(compress(e), [0, 0]));
    expect(failures.map((f) => f.detail)).toEqual([
      expect.stringMatching(/^chunk 0: bytes follow the zstd frame, which ends at byte \d+ /),
    ]);
  });
});
