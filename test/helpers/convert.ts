// Shared helpers for the conversion tests: the real fixtures, conversion defaults, directory snapshots, the
// Python checkers, and AXLearn's structure check and `.zarray` form re-implemented from its sources.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { cpSync, existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import { type ConvertResult, convert, type PlanPhaseOptions } from "../../src/convert/convert.js";
import type { ExecuteOptions } from "../../src/convert/execute.js";
import { type Plan, type PlannedObject, parseCommitPart, parsePart, parsePlan } from "../../src/convert/plan-format.js";
import { commitPartKey, PLAN_KEY, planPartKey, WORK_DIR } from "../../src/convert/work-dir.js";
import { DEFAULT_CONCURRENCY, DEFAULT_MEMORY_MIB, DEFAULT_PLAN_GROUPS, mibToBytes } from "../../src/defaults.js";
import { AXLEARN_PYTHON, FIXTURES, GENERATED, PYTHON, UPSTREAM } from "./paths.js";
import { tempDir } from "./tmp.js";

export const SAMPLE = `${FIXTURES}/axlearn-regular-sample/step_00000100`;
export { UPSTREAM } from "./paths.js";

/** A real Orbax checkpoint and where its parts are. */
export interface FixtureCase {
  readonly id: string;
  readonly label: string;
  /** What is passed to `convert` (a step directory or an emergency root). */
  readonly location: string;
  /** `step_%08d`, the step directory the conversion writes. */
  readonly stepDir: string;
  /** The PyTree item holding the arrays. */
  readonly item: string;
  /** AXLearn's index as Orbax stored it (absent for a plain Orbax composite checkpoint). */
  readonly index?: string;
  readonly expected?: string;
  readonly zarrFormat: 2 | 3;
  /** `--step` for sources whose directory does not name the step. */
  readonly step?: number;
  /** Converted through the CLI (in-process) instead of the `convert()` API. */
  readonly viaCli?: boolean;
}

const axlearnStep = (id: string, label: string, dir: string, step: string, zarrFormat: 2 | 3, viaCli = false): FixtureCase => ({
  id,
  label,
  location: `${dir}/${step}`,
  stepDir: step,
  item: `${dir}/${step}/state`,
  index: `${dir}/${step}/index/index`,
  expected: `${dir}/expected.json`,
  zarrFormat,
  viaCli,
});

/** Every real Orbax checkpoint the project has that must convert. */
export const FIXTURE_CASES: readonly FixtureCase[] = [
  axlearnStep("tiny", "shared tiny (AXLearn layout, zarr v2)", `${FIXTURES}/orbax-axlearn/tiny`, "step_00000100", 2, true),
  axlearnStep("shared-dtypes", "shared dtypes (every dtype, NaN/-0.0/inf)", `${FIXTURES}/orbax-axlearn/dtypes`, "step_00000100", 2),
  axlearnStep("shared-zarr3", "shared zarr3", `${FIXTURES}/orbax-axlearn/zarr3`, "step_00000100", 3, true),
  axlearnStep("dtypes", "generated dtypes (8-way sharded, rank 0 and 1)", `${GENERATED}/dtypes`, "step_00000100", 2),
  axlearnStep("zarr3", "generated zarr3 (fill-value chunks stored)", `${GENERATED}/zarr3`, "step_00000100", 3),
  axlearnStep("zarr3-nofill", "generated zarr3 with absent fill-value chunks", `${GENERATED}/zarr3_nofill`, "step_00000100", 3),
  axlearnStep("large", "generated large (multi-MB out-of-line chunks, subchunked)", `${GENERATED}/large`, "step_00000200", 2, true),
  axlearnStep("multiprocess", "generated two-process save (merged root)", `${GENERATED}/multiprocess`, "step_00000100", 2),
  axlearnStep("iterators", "generated iterators (python state file)", `${GENERATED}/iterators`, "step_00000100", 2),
  axlearnStep(
    "multiprocess-iterators",
    "generated two-process save, each process's python iterator",
    `${GENERATED}/multiprocess_iterators`,
    "step_00000100",
    2,
  ),
  {
    id: "emergency",
    label: "generated emergency layout (tensors/ + non-tensors/)",
    location: `${GENERATED}/emergency`,
    stepDir: "step_00000100",
    item: `${GENERATED}/emergency/tensors/step_00000100/default`,
    index: `${GENERATED}/emergency/non-tensors/step_00000100/index`,
    expected: `${GENERATED}/emergency/expected.json`,
    zarrFormat: 3,
    viaCli: true,
  },
  {
    id: "upstream-composite",
    label: "Orbax's own composite checkpoint (no AXLearn index; --step 7)",
    location: `${UPSTREAM}/checkpoint_metadata_present/pytree_checkpointable_has_metadata`,
    stepDir: "step_00000007",
    item: `${UPSTREAM}/checkpoint_metadata_present/pytree_checkpointable_has_metadata/state`,
    zarrFormat: 2,
    step: 7,
  },
];

export function fixtureCase(id: string): FixtureCase {
  const c = FIXTURE_CASES.find((f) => f.id === id);
  if (c === undefined) throw new Error(`no fixture ${id}`);
  return c;
}

const scratchDirs: string[] = [];

/** A new temporary directory, removed by removeScratch() (each test file calls it in afterAll). */
export function scratch(label: string): string {
  const dir = tempDir(label);
  scratchDirs.push(dir);
  return dir;
}

/**
 * Keeps them when ORBAX2REG_KEEP_SCRATCH is set, to read the logs of a failed run (with ORBAX2REG_KEEP_TMP=1: they
 * are in the run's temporary folder, which the run removes otherwise, test/setup/global.ts).
 */
export function removeScratch(): void {
  if (process.env.ORBAX2REG_KEEP_SCRATCH) return;
  for (const dir of scratchDirs.splice(0)) rmSync(dir, { recursive: true, force: true });
}

export type ConvertOptions = PlanPhaseOptions & ExecuteOptions;

export const CONVERT_DEFAULTS: ConvertOptions = {
  groups: DEFAULT_PLAN_GROUPS,
  paramsOnly: false,
  allowUncommitted: false,
  force: false,
  dryRun: false,
  concurrency: DEFAULT_CONCURRENCY,
  memoryBytes: mibToBytes(DEFAULT_MEMORY_MIB),
};

/** `convert()` with the CLI's defaults. */
export function convertWith(source: string, destinationRoot: string, options: Partial<ConvertOptions> = {}): Promise<ConvertResult> {
  return convert(source, destinationRoot, { ...CONVERT_DEFAULTS, ...options });
}

export { WORK_DIR };

/** Every file under `dir` (relative `/` paths, sorted) with its bytes; the tool's work dir is left out. */
export function snapshot(dir: string, keep: (rel: string) => boolean = (rel) => !rel.startsWith(`${WORK_DIR}/`)): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  const entries = existsSync(dir) ? readdirSync(dir, { recursive: true, withFileTypes: true }) : [];
  for (const e of entries) {
    if (e.isDirectory()) continue;
    const p = join(e.parentPath, e.name);
    const rel = relative(dir, p).split("\\").join("/");
    if (keep(rel)) out.set(rel, readFileSync(p));
  }
  return new Map([...out.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

/** sha256 per file, for readable diffs of two snapshots. */
export function digests(files: ReadonlyMap<string, Buffer>): Record<string, string> {
  return Object.fromEntries([...files].map(([k, v]) => [k, sha256(v)]));
}

export function sha256(data: Uint8Array | string): string {
  return createHash("sha256").update(data).digest("hex");
}

/** A private copy of a fixture directory that a test may damage. */
export function copyOf(dir: string, label = "copy"): string {
  const root = scratch(label);
  const name = dir.replace(/\/+$/, "").split("/").pop() as string;
  cpSync(dir, join(root, name), { recursive: true });
  return join(root, name);
}

/** Relative paths of every file under `dir` (the tool's work dir included). */
export function fileList(dir: string): string[] {
  return [...snapshot(dir, () => true).keys()];
}

// ---------------------------------------------------------------------------------------------------
// AXLearn's structure check (checkpointer.py check_state_structure), from its source: both sides become
// sorted([f"{path}={value}"]) where value is the JSON-loaded Python object, so a dict prints as its repr.

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

/** Python's repr() of a value json.loads produced (dicts keep their key order). */
export function pyRepr(v: Json): string {
  if (v === null) return "None";
  if (v === true) return "True";
  if (v === false) return "False";
  if (typeof v === "number") {
    if (!Number.isInteger(v)) throw new Error(`non-integer ${v}: not in an AXLearn index`);
    return String(v);
  }
  if (typeof v === "string") return pyStr(v);
  if (Array.isArray(v)) return `[${v.map(pyRepr).join(", ")}]`;
  return `{${Object.entries(v)
    .map(([k, x]) => `${pyStr(k)}: ${pyRepr(x)}`)
    .join(", ")}}`;
}

/** Python's str repr: single quotes unless the text holds ' and no ", then double quotes. */
function pyStr(s: string): string {
  const q = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = q;
  for (const ch of s) {
    const code = ch.codePointAt(0) as number;
    if (ch === "\\") out += "\\\\";
    else if (ch === q) out += `\\${q}`;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (code < 0x20 || code === 0x7f) out += `\\x${code.toString(16).padStart(2, "0")}`;
    else out += ch;
  }
  return out + q;
}

/** Python's sorted() of str: by code point. */
function pySorted(xs: string[]): string[] {
  const cmp = (a: string, b: string) => {
    const x = [...a];
    const y = [...b];
    for (let i = 0; i < Math.min(x.length, y.length); i++) {
      const d = (x[i]?.codePointAt(0) as number) - (y[i]?.codePointAt(0) as number);
      if (d !== 0) return d;
    }
    return x.length - y.length;
  };
  return [...xs].sort(cmp);
}

export type IndexEntries = [string, Json][];

/** The strings AXLearn's EXACT validation compares: f"{path}={value}" is str(value), which is repr() except for str. */
export function axlearnStructure(entries: IndexEntries): string[] {
  return pySorted(entries.map(([path, value]) => `${path}=${typeof value === "string" ? value : pyRepr(value)}`));
}

export function readIndex(path: string): IndexEntries {
  return JSON.parse(readFileSync(path, "utf8")) as IndexEntries;
}

// ---------------------------------------------------------------------------------------------------
// The `.zarray` AXLearn's regular checkpointer writes (tensorstore's zarr driver via jax): compact JSON,
// keys sorted, zstd level 1, fill_value and filters null, C order, "." separator, no newline.

export function axlearnZarray(z: { dtype: string; shape: readonly number[]; chunks: readonly number[] }): string {
  return (
    `{"chunks":[${z.chunks.join(",")}],"compressor":{"id":"zstd","level":1},"dimension_separator":".",` +
    `"dtype":${JSON.stringify(z.dtype)},"fill_value":null,"filters":null,"order":"C","shape":[${z.shape.join(",")}],"zarr_format":2}`
  );
}

/** Every `gda/<path>/.zarray` of a regular step: path -> bytes. */
export function zarrays(stepDir: string): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  for (const [rel, data] of snapshot(join(stepDir, "gda"))) if (rel.endsWith("/.zarray")) out.set(rel.slice(0, -"/.zarray".length), data);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// The Python checkers (test/python). One process checks many steps; each prints one JSON line per case.

export interface CheckCase {
  name: string;
  regular: string;
  source_item: string;
  source_kvstore?: string;
  source_index?: string;
  params_only?: boolean;
  orbax?: boolean;
}

export interface CheckSummary {
  name: string;
  problems: string[];
  params_only?: boolean;
  index_entries?: number;
  step?: number;
  structure?: string[];
  structure_exact_vs_source_index?: boolean;
  index_bytes_equal_json_dumps?: boolean;
  structure_exact_vs_restored_arrays?: boolean;
  index_bytes_equal_axlearn_save?: boolean;
  source_zarr_format?: number;
  source_arrays_tensorstore?: number;
  source_arrays_orbax?: number;
  orbax_agrees_with_tensorstore?: boolean;
  arrays?: number;
  arrays_matched?: number;
  bytes_compared?: number;
  chunk_files?: number;
  zarray_axlearn_form?: number;
  zarray_identical_to_source?: number;
}

function runPython(script: string, args: string[], timeout = 300_000, python = PYTHON): string[] {
  const r = spawnSync(python, [script, ...args], { encoding: "utf8", timeout, maxBuffer: 64 << 20 });
  if (r.status !== 0) throw new Error(`${script} exited ${r.status ?? r.signal}:\n${r.stderr.slice(-4000)}`);
  return r.stdout.split("\n").filter((l) => l.startsWith("{"));
}

const abs = (p: string) => resolve(p);

/** Runs test/python/check_regular.py once for all cases; summaries by case name. */
export function checkRegular(cases: CheckCase[]): Map<string, CheckSummary> {
  const file = join(scratch("cases"), "cases.json");
  const absolute = cases.map((c) => ({
    ...c,
    regular: abs(c.regular),
    source_item: abs(c.source_item),
    ...(c.source_kvstore === undefined ? {} : { source_kvstore: abs(c.source_kvstore) }),
    ...(c.source_index === undefined ? {} : { source_index: abs(c.source_index) }),
  }));
  writeFileSync(file, JSON.stringify(absolute));
  const out = new Map<string, CheckSummary>();
  for (const line of runPython("test/python/check_regular.py", [file])) {
    const s = JSON.parse(line) as CheckSummary;
    out.set(s.name, s);
  }
  return out;
}

export interface RestoreCase {
  name: string;
  /** The regular checkpoint root and step to restore. */
  root: string;
  step: number;
  /** trainer: Checkpointer.restore with the source's specs; inference: InferenceRunner's default builder. */
  mode: "trainer" | "inference";
  /** The directory holding the source's AXLearn `index` file (what read_state_spec reads). */
  source_index: string;
  /** The source's PyTree item (absent: a control without a source; the restored small values are returned). */
  source_item?: string;
  /** The source's python/python_0 directory, to compare restored iterators with. */
  source_python?: string;
  validation?: "EXACT" | "CONTAINS_STATE";
  /** The export was written with --dtype bfloat16 (trainer mode: its specs are cast too). */
  cast?: "bfloat16";
  /** inference mode: the dtype of the model's floating-point specs. */
  model_dtype?: "bfloat16" | "float32";
  /** trainer mode: restore on this many jax.distributed processes (each compares its own iterator). */
  processes?: number;
  /** The index's tf.data iterator is `iter(tf.data.Dataset.range(range))`; process i's must yield next[i] first. */
  tf_iterator?: { range: number; next: number[] };
}

export interface RestoreSummary {
  name: string;
  problems: string[];
  step?: number;
  validation?: string;
  arrays?: number;
  matched?: number;
  dtypes?: Record<string, string>;
  iterators?: Record<string, boolean>;
  small?: Record<string, unknown>;
  /** With `processes`: each process's own summary. */
  processes?: (RestoreSummary & { process: number })[];
}

/** Why AXLearn's restore cannot run here (scripts/install.sh installs it only with ORBAX2REG_AXLEARN), or undefined. */
export function axlearnUnavailable(): string | undefined {
  return existsSync(AXLEARN_PYTHON) ? undefined : `no ${AXLEARN_PYTHON}: set ORBAX2REG_AXLEARN and run npm run setup`;
}

/** Runs test/python/axlearn_restore.py (AXLearn's own Checkpointer and InferenceRunner builder) once for all cases. */
export function axlearnRestore(cases: RestoreCase[]): Map<string, RestoreSummary> {
  const file = join(scratch("restore"), "cases.json");
  const absolute = cases.map((c) => ({
    ...c,
    root: abs(c.root),
    source_index: abs(c.source_index),
    ...(c.source_item ? { source_item: abs(c.source_item) } : {}),
    ...(c.source_python ? { source_python: abs(c.source_python) } : {}),
  }));
  writeFileSync(file, JSON.stringify(absolute));
  const out = new Map<string, RestoreSummary>();
  for (const line of runPython("test/python/axlearn_restore.py", [file], 600_000, AXLEARN_PYTHON)) {
    const s = JSON.parse(line) as RestoreSummary;
    out.set(s.name, s);
  }
  return out;
}

/** The plan on record in a local destination step with every object of its parts, group after group. */
export function planOnDisk(stepDir: string): Plan & { objects: PlannedObject[] } {
  const read = (key: string) => readFileSync(join(stepDir, key), "utf8");
  const head = parsePlan(read(PLAN_KEY), PLAN_KEY);
  const objects: PlannedObject[] = [];
  head.groups.forEach((g, group) => {
    for (let part = 0; part < g.parts; part++) {
      for (const o of parsePart(head, { group, part }, read(planPartKey(head.id, group, part)), `group ${group} part ${part}`).objects) {
        objects.push(o);
      }
    }
  });
  return { ...parseCommitPart(head, read(commitPartKey(head.id)), "commit part"), objects };
}

/** Every record segment's objects of plan `planId` in a local destination step, whatever group they are kept under. */
export function recordedOnDisk(stepDir: string, planId: string): [string, number, number | null][] {
  const dir = join(stepDir, WORK_DIR, "records", planId);
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .flatMap((e) => JSON.parse(readFileSync(join(e.parentPath, e.name), "utf8")).objects);
}
