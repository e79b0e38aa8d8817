import { describe, expect, test } from "vitest";
import { table } from "../../src/cli/format.js";

test("a table sizes its columns over more rows than a call's arguments can hold", () => {
  const rows = Array.from({ length: 130_000 }, (_, i) => [`a${i}`, String(i)]);
  const lines = table(["array", "n"], rows, new Set([1])).split("\n");
  expect(lines).toHaveLength(130_001);
  expect(lines[0]).toBe("array         n");
  expect(lines[1]).toBe(`${"a0".padEnd(7)}  ${"0".padStart(6)}`);
  expect(lines[130_000]).toBe("a129999  129999");
});

describe("a table wider than the terminal", () => {
  const header = ["path", "dtype", "shape", "n"];
  const rows = [
    [
      "learner/optimizer/1/0/mu/decoder/transformer/repeat/layer/self_attention/attention/i_proj/i_proj/qkv_proj/weight",
      "float32",
      "(32, 4096, 3, 32, 128)",
      "32",
    ],
    ["prng_key", "uint32", "(4,)", "1"],
  ];

  test("puts each path on a line of its own, whole, and the other cells on the next, aligned among themselves", () => {
    expect(table(header, rows, new Set([3]), 100).split("\n")).toEqual([
      "path",
      "  dtype    shape                    n",
      rows[0]?.[0],
      "  float32  (32, 4096, 3, 32, 128)  32",
      "prng_key",
      "  uint32   (4,)                     1",
    ]);
  });

  test("puts the last cell on a third line when the rest is still too wide (a sha256)", () => {
    const sha = "ab".repeat(32);
    const lines = table(
      [...header, "sha256"],
      rows.map((r) => [...r, sha]),
      new Set([3]),
      60,
    ).split("\n");
    expect(lines.slice(0, 3)).toEqual(["path", "  dtype    shape                    n", "  sha256"]);
    expect(lines.slice(6, 9)).toEqual(["prng_key", "  uint32   (4,)                     1", `  ${sha}`]);
  });

  test("stays one row per line when it fits, or when there is no width to fit (a pipe)", () => {
    expect(table(header, rows.slice(1), new Set([3]), 100)).toBe("path      dtype   shape  n\nprng_key  uint32  (4,)   1");
    expect(table(header, rows, new Set([3])).split("\n")).toHaveLength(3);
  });
});
