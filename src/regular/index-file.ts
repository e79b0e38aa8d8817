import { MetadataError } from "../errors.js";
import { pythonJsonDumps } from "./python-json.js";

/** One `[path, value]` pair of an AXLearn index: `{"dtype", "shape"}` for arrays, a string or raw value otherwise. */
export type IndexEntry = [path: string, value: unknown];

/** AXLearn's shape string: `str(tuple(shape))`, e.g. "()", "(4,)", "(4, 8)". */
export function shapeRepr(shape: readonly number[]): string {
  return shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(", ")})`;
}

export function arrayEntry(path: string, dtype: string, shape: readonly number[]): IndexEntry {
  // Key order matters: AXLearn validates `f"{path}={value}"` strings, and the dict repr keeps JSON order.
  return [path, { dtype, shape: shapeRepr(shape) }];
}

/** The index file's bytes as AXLearn writes them: `json.dumps([["step", N], *entries])`, no newline. */
export function indexText(step: number, entries: readonly IndexEntry[]): string {
  return pythonJsonDumps([["step", step], ...entries]);
}

/** Parses an index file into its step and entries, checking the shape AXLearn requires. */
export function parseIndex(text: string, path: string): { step: number; entries: IndexEntry[] } {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new MetadataError(`index is not valid JSON (${(e as Error).message})`, { path });
  }
  if (!Array.isArray(json) || !json.every((e) => Array.isArray(e) && e.length === 2 && typeof e[0] === "string")) {
    throw new MetadataError("index must be a list of [path, value] pairs", { path });
  }
  const [first, ...rest] = json as IndexEntry[];
  if (first?.[0] !== "step" || !Number.isSafeInteger(first[1])) {
    throw new MetadataError('index must start with ["step", <integer>]', { path, key: "step" });
  }
  return { step: first[1] as number, entries: rest };
}

/** AXLearn's structure check under EXACT validation: the sorted `path=value` strings. */
export function structureStrings(step: number, entries: readonly IndexEntry[]): string[] {
  // f"{path}={value}" formats the value with str(): a string as itself, anything else as its repr.
  return [["step", step] as IndexEntry, ...entries].map(([p, v]) => `${p}=${typeof v === "string" ? v : pythonRepr(v)}`).sort();
}

/** Python's repr of a JSON-loaded value (dicts keep their order, strings get single quotes). */
function pythonRepr(v: unknown): string {
  if (v === null) return "None";
  if (v === true) return "True";
  if (v === false) return "False";
  if (typeof v === "number") return String(v);
  if (typeof v === "string") {
    // Python picks double quotes when the string has a single quote and no double quote.
    const quote = v.includes("'") && !v.includes('"') ? '"' : "'";
    return `${quote}${v.replace(/\\/g, "\\\\").replace(quote === "'" ? /'/g : /(?!)/g, "\\'")}${quote}`;
  }
  if (Array.isArray(v)) return `[${v.map(pythonRepr).join(", ")}]`;
  return `{${Object.entries(v as Record<string, unknown>)
    .map(([k, x]) => `${pythonRepr(k)}: ${pythonRepr(x)}`)
    .join(", ")}}`;
}
