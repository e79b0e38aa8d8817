// The checkpoint AXLearn's own Checkpointer.save() wrote is the ground truth for the output format: the
// index and .zarray writers reproduce its bytes, and the .zarray form the other tests demand is its form.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { arrayEntry, indexText } from "../../src/regular/index-file.js";
import { zarrayText } from "../../src/regular/zarray.js";
import { dtypeFromZarr2 } from "../../src/zarr/dtype.js";
import { axlearnStructure, axlearnZarray, readIndex, SAMPLE, zarrays } from "../helpers/convert.js";

/** numpy names of the typestrs the sample uses (tensorstore's zarr v2 dtype strings). */
const NUMPY_NAME: Record<string, string> = { "<i4": "int32", "<f4": "float32", "<u4": "uint32", bfloat16: "bfloat16" };

/** The sample's arrays as AXLearn's flatten order gives them (dict keys sorted), read from their .zarray. */
function sampleArrays() {
  return [...zarrays(SAMPLE)]
    .sort(([a], [b]) => (a < b ? -1 : 1))
    .map(([path, data]) => {
      const z = JSON.parse(data.toString()) as { dtype: string; shape: number[]; chunks: number[] };
      return { path, zarray: data.toString(), ...z };
    });
}

describe("AXLearn's own regular checkpoint (test/fixtures/axlearn-regular-sample)", () => {
  test("has the four arrays its README lists", () => {
    expect(sampleArrays().map((a) => a.path)).toEqual(["learner/optimizer/count", "model/linear/bias", "model/linear/weight", "prng_key"]);
  });

  test("indexText rebuilds its index byte for byte from the dtype and shape in its .zarray files", () => {
    const entries = sampleArrays().map((a) => arrayEntry(a.path, NUMPY_NAME[a.dtype] as string, a.shape));
    expect(indexText(100, entries)).toBe(readFileSync(join(SAMPLE, "index"), "utf8"));
  });

  test("its index passes AXLearn's EXACT structure check against the rebuilt one", () => {
    const entries = sampleArrays().map((a) => arrayEntry(a.path, NUMPY_NAME[a.dtype] as string, a.shape));
    const rebuilt = JSON.parse(indexText(100, entries));
    expect(axlearnStructure(rebuilt)).toEqual(axlearnStructure(readIndex(join(SAMPLE, "index"))));
  });

  test("every .zarray it holds has the form the conversion tests require of converted .zarray files", () => {
    for (const a of sampleArrays()) expect(a.zarray).toBe(axlearnZarray(a));
  });

  test("zarrayText (used for zarr v3 sources) writes its .zarray bytes exactly", () => {
    for (const a of sampleArrays()) {
      const dtype = dtypeFromZarr2(a.dtype, { path: a.path });
      expect(zarrayText({ shape: a.shape, chunkShape: a.chunks, dtype })).toBe(a.zarray);
    }
  });
});
