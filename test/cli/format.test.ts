import { expect, test } from "vitest";
import { table } from "../../src/cli/format.js";

test("a table sizes its columns over more rows than a call's arguments can hold", () => {
  const rows = Array.from({ length: 130_000 }, (_, i) => [`a${i}`, String(i)]);
  const lines = table(["array", "n"], rows, new Set([1])).split("\n");
  expect(lines).toHaveLength(130_001);
  expect(lines[0]).toBe("array         n");
  expect(lines[1]).toBe(`${"a0".padEnd(7)}  ${"0".padStart(6)}`);
  expect(lines[130_000]).toBe("a129999  129999");
});
