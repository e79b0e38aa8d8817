import { expect, test } from "vitest";
import { indexText, memorySize, parseSize, planShards, shardName, shardSize } from "../../src/hf/shards.js";

test("sizes are decimal for KB/MB/GB (5GB = 5 * 10^9, as transformers) and binary for KiB/MiB/GiB", () => {
  expect(shardSize("5GB")).toBe(5e9);
  expect(shardSize("500MB")).toBe(5e8);
  expect(shardSize("2GiB")).toBe(2 * 2 ** 30);
  expect(shardSize("1000")).toBe(1000);
  expect(memorySize("256")).toBe(256 * 2 ** 20);
  expect(() => parseSize("5 parsecs")).toThrow(/size/);
});

test("a tensor joins the shard unless it would take it over the limit; a tensor over the limit gets a shard alone, in its place", () => {
  expect(planShards([40, 40, 30, 10], 100)).toEqual([
    [0, 1],
    [2, 3],
  ]);
  expect(planShards([40, 150, 30], 100)).toEqual([[0], [1], [2]]);
  expect(planShards([40, 20, 150, 30, 10], 100)).toEqual([[0, 1], [2], [3, 4]]);
  expect(planShards([50, 50, 1], 100)).toEqual([[0, 1], [2]]);
  expect(planShards([10], 100)).toEqual([[0]]);
});

test("shards are named as transformers names them, even when there is one", () => {
  expect(shardName(0, 1)).toBe("model-00001-of-00001.safetensors");
  expect(shardName(2, 12)).toBe("model-00003-of-00012.safetensors");
});

test("the index is json.dumps(sort_keys=True, indent=2) with a newline", () => {
  const text = indexText(
    30,
    new Map([
      ["b.weight", "model-00002-of-00002.safetensors"],
      ["a.weight", "model-00001-of-00002.safetensors"],
    ]),
  );
  expect(text).toBe(
    '{\n  "metadata": {\n    "total_size": 30\n  },\n  "weight_map": {\n    "a.weight": "model-00001-of-00002.safetensors",\n    "b.weight": "model-00002-of-00002.safetensors"\n  }\n}\n',
  );
  expect(JSON.parse(text).weight_map["b.weight"]).toBe("model-00002-of-00002.safetensors");
});
