// The writer checks a passed-through chunk's zstd frame header as its bytes stream by (convert/transforms.ts);
// wrapping a store's stream for that must not cost the destination its unbuffered upload.
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, expect, test } from "vitest";
import { compress } from "../../src/codecs/zstd.js";
import { headChecked } from "../../src/convert/transforms.js";
import { LocalStore } from "../../src/store/local.js";
import { rangedOf, replayOf } from "../../src/store/replay.js";
import { removeScratch, scratch } from "../helpers/convert.js";

afterAll(removeScratch);

test("a checked store stream stays readable again and from any offset (a GCS upload then streams it unbuffered)", async () => {
  const dir = scratch("frame-header");
  mkdirSync(dir, { recursive: true });
  const frame = compress(new Uint8Array(100_000).map((_, i) => i % 7));
  writeFileSync(join(dir, "chunk"), frame);
  const heads: number[] = [];
  const checked = headChecked(new LocalStore(dir).readStream("chunk", 0, frame.length), (head) => heads.push(head.length));
  const ranged = rangedOf(checked);
  if (ranged === undefined) throw new Error("the checked stream is not ranged");
  expect(ranged.length).toBe(frame.length);
  expect(replayOf(checked)).toBeTypeOf("function");
  const read = async (pieces: AsyncIterable<Uint8Array>) => {
    const out: Uint8Array[] = [];
    for await (const p of pieces) out.push(p);
    return Buffer.concat(out);
  };
  expect(Buffer.compare(await read(checked), frame)).toBe(0);
  expect(Buffer.compare(await read(ranged.from(10)), frame.subarray(10))).toBe(0);
  expect(heads).toEqual([18]); // the header checked on the read from the start only
});
