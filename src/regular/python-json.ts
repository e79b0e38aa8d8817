/**
 * `json.dumps(value)` exactly as CPython writes it with default arguments: ", " and ": " separators,
 * ASCII-only output (\uXXXX escapes, surrogate pairs for astral characters), keys in insertion order.
 * AXLearn compares index files byte for byte in spirit (sorted "path=value" strings), so we match it.
 */
export function pythonJsonDumps(value: unknown): string {
  if (value === null) return "null";
  if (value === true) return "true";
  if (value === false) return "false";
  if (typeof value === "number") return pythonNumber(value);
  if (typeof value === "string") return pythonString(value);
  if (Array.isArray(value)) return `[${value.map(pythonJsonDumps).join(", ")}]`;
  if (typeof value === "object") {
    return `{${Object.entries(value as Record<string, unknown>)
      .map(([k, v]) => `${pythonString(k)}: ${pythonJsonDumps(v)}`)
      .join(", ")}}`;
  }
  throw new TypeError(`not JSON-serializable: ${typeof value}`);
}

function pythonNumber(n: number): string {
  if (Number.isNaN(n)) return "NaN";
  if (n === Infinity) return "Infinity";
  if (n === -Infinity) return "-Infinity";
  // Integers (how every number in an AXLearn index arrives) print the same in both languages; so do other
  // floats, with the same shortest digits, except below 1e-4, where Python's repr switches to an exponent
  // (JS only below 1e-6) and writes it with at least two digits: 1e-05, 1.5e-07.
  if (Number.isInteger(n) || Math.abs(n) >= 1e-4) return String(n);
  const [mantissa, exponent] = n.toExponential().split("e") as [string, string];
  return `${mantissa}e-${exponent.slice(1).padStart(2, "0")}`;
}

const ESCAPES: Record<string, string> = { '"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f" };

function pythonString(s: string): string {
  let out = '"';
  for (let i = 0; i < s.length; i++) {
    const ch = s[i] as string;
    const code = s.charCodeAt(i);
    const esc = ESCAPES[ch];
    if (esc !== undefined) out += esc;
    else if (code < 0x20 || code > 0x7e) out += `\\u${code.toString(16).padStart(4, "0")}`;
    else out += ch;
  }
  return `${out}"`;
}
