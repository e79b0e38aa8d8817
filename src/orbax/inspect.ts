import { arraySha256, listArrays, type StoredArray } from "./arrays.js";
import { type MissingIterator, missingIterators, type ProcessIterators } from "./processes.js";
import type { OrbaxStep } from "./step.js";

/** One array in `inspect --json` (numpy dtype names; shapes as lists). */
export interface ArrayReport {
  path: string;
  name: string;
  dtype: string;
  shape: number[];
  chunkShape: number[];
  chunks: number;
  storedBytes: number;
  storage: "inline" | "out-of-line" | "mixed" | "none";
  sha256?: string;
}

/** The processes that saved the step (from its per-process records) and each one's iterator files. */
export interface ProcessesReport {
  count: number;
  /** Process indices with their own OCDBT database (`ocdbt.process_<i>/`). */
  databases: number[];
  /** Process indices with their own `array_metadatas/process_<i>`. */
  arrayMetadatas: number[];
  iterators: ProcessIterators[];
  /** Iterator files one process has and another lacks: convert refuses such a step. */
  missingIterators: MissingIterator[];
}

/**
 * A leaf of the PyTree that is not an array (no zarr data in the database): its path, and what `_METADATA`
 * records of it, Orbax's value type (`None`, `PythonSavable` for an input iterator saved as files...) and
 * whether restore skips it.
 */
export interface NonArrayReport {
  path: string;
  name: string;
  valueType: string;
  skipDeserialize: boolean;
}

export interface InspectReport {
  step: number | null;
  committed: boolean;
  layout: string;
  processes: ProcessesReport;
  arrays: ArrayReport[];
  nonArrays: NonArrayReport[];
  warnings: string[];
}

/**
 * What `inspect` reports about an opened step: every array leaf (with its content's sha256 when `checksums`
 * is set), every other leaf, the step number, commit status, layout and warnings. Prints nothing; `onArray` hears how many
 * arrays are done.
 */
export async function inspectStep(
  step: OrbaxStep,
  options: { checksums?: boolean; onArray?: (done: number) => void } = {},
): Promise<InspectReport> {
  const arrays: ArrayReport[] = [];
  for await (const a of listArrays(step)) {
    const report = arrayReport(a);
    if (options.checksums) report.sha256 = await arraySha256(step, a);
    arrays.push(report);
    options.onArray?.(arrays.length);
  }
  const p = step.processes;
  const processes: ProcessesReport = {
    count: p.count,
    databases: [...p.databases],
    arrayMetadatas: [...p.arrayMetadatas],
    iterators: p.iterators.map((i) => ({ process: i.process, files: [...i.files] })),
    missingIterators: missingIterators(p),
  };
  return {
    step: step.step ?? null,
    committed: step.commit.committed,
    layout: step.layout,
    processes,
    arrays,
    nonArrays: step.leaves
      .filter((l) => !l.isArray)
      .map((l) => ({ path: l.path, name: l.name, valueType: l.valueType, skipDeserialize: l.skipDeserialize })),
    warnings: [...step.warnings],
  };
}

function arrayReport(a: StoredArray): ArrayReport {
  const n = a.chunks.size;
  return {
    path: a.leaf.path,
    name: a.leaf.name,
    dtype: a.meta.dtype.name,
    shape: [...a.meta.shape],
    chunkShape: [...a.meta.chunkShape],
    chunks: n,
    storedBytes: a.storedBytes,
    storage: n === 0 ? "none" : a.inlineChunks === n ? "inline" : a.inlineChunks === 0 ? "out-of-line" : "mixed",
  };
}
