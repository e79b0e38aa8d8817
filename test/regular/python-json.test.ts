// pythonJsonDumps must write what CPython's json.dumps writes with default arguments; each case is
// checked against a literal expected string and against python3 itself (one process for all cases).
import { spawnSync } from "node:child_process";
import { describe, expect, test } from "vitest";
import { pythonJsonDumps } from "../../src/regular/python-json.js";

/** [name, JS value, the same value as a Python expression (ASCII), what json.dumps prints]. */
const CASES: [string, unknown, string, string][] = [
  ["null", null, "None", "null"],
  ["booleans", [true, false], "[True, False]", "[true, false]"],
  ["zero", 0, "0", "0"],
  ["a negative integer", -17, "-17", "-17"],
  ["the largest safe integer", 2 ** 53 - 1, "2**53 - 1", "9007199254740991"],
  ["a float with a short repr", 0.1, "0.1", "0.1"],
  ["a negative fraction", -2.25, "-2.25", "-2.25"],
  ["a large float in exponent form", 1.5e300, "1.5e300", "1.5e+300"],
  ["the smallest float Python writes without an exponent", 0.0001, "0.0001", "0.0001"],
  ["a small float in exponent form, two exponent digits", 1e-5, "1e-05", "1e-05"],
  ["a small negative float below JS's own switch to exponents", -1.5e-7, "-1.5e-07", "-1.5e-07"],
  ["the smallest subnormal float", 5e-324, "5e-324", "5e-324"],
  ["NaN", Number.NaN, "float('nan')", "NaN"],
  ["Infinity", Number.POSITIVE_INFINITY, "float('inf')", "Infinity"],
  ["-Infinity", Number.NEGATIVE_INFINITY, "float('-inf')", "-Infinity"],
  ["the empty string", "", "''", '""'],
  ["quote and backslash", 'a"b\\c', "'a\"b\\\\c'", '"a\\"b\\\\c"'],
  ["short escapes", "\n\r\t\b\f", "'\\n\\r\\t\\b\\f'", '"\\n\\r\\t\\b\\f"'],
  ["other control characters and DEL", "\u0000\u001f\u007f", "'\\x00\\x1f\\x7f'", '"\\u0000\\u001f\\u007f"'],
  ["a slash is not escaped", "a/b", "'a/b'", '"a/b"'],
  ["Latin-1 is escaped in lowercase hex", "é", "'\\u00e9'", '"\\u00e9"'],
  ["CJK", "日本", "'\\u65e5\\u672c'", '"\\u65e5\\u672c"'],
  ["an astral character as a surrogate pair", "😀", "'\\U0001F600'", '"\\ud83d\\ude00"'],
  ["a lone surrogate", "\ud800", "'\\ud800'", '"\\ud800"'],
  ["empty containers", [[], {}], "[[], {}]", "[[], {}]"],
  ["nested lists", [1, [2, [3, []]], "x"], "[1, [2, [3, []]], 'x']", '[1, [2, [3, []]], "x"]'],
  [
    "objects keep insertion order and use ', ' and ': '",
    { b: 1, a: [{ x: null }], é: "v" },
    "{'b': 1, 'a': [{'x': None}], '\\u00e9': 'v'}",
    '{"b": 1, "a": [{"x": null}], "\\u00e9": "v"}',
  ],
];

describe("pythonJsonDumps", () => {
  test.each(CASES)("%s", (_, value, __, expected) => {
    expect(pythonJsonDumps(value)).toBe(expected);
  });

  test("every case matches what python3's json.dumps prints", () => {
    const script = `import json\n${CASES.map(([, , py]) => `print(json.dumps(${py}))`).join("\n")}\n`;
    const r = spawnSync("python3", ["-c", script], { encoding: "utf8" });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout.trimEnd().split("\n")).toEqual(CASES.map(([, value]) => pythonJsonDumps(value)));
  });

  test("undefined, functions and bigints are refused with a TypeError", () => {
    expect(() => pythonJsonDumps(undefined)).toThrow(TypeError);
    expect(() => pythonJsonDumps(() => 1)).toThrow(TypeError);
    expect(() => pythonJsonDumps(1n)).toThrow(TypeError);
    expect(() => pythonJsonDumps({ a: undefined })).toThrow(TypeError);
  });
});
