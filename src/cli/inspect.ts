import { arraySha256, listArrays, type StoredArray } from "../orbax/arrays.js";
import { type OrbaxStep, openStep } from "../orbax/step.js";
import { formatBytes, formatShape, table } from "./format.js";
import type { Output } from "./output.js";

export interface InspectOptions {
  json?: boolean;
  checksums?: boolean;
  step?: number;
}

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

export interface InspectReport {
  step: number | null;
  committed: boolean;
  layout: string;
  arrays: ArrayReport[];
  warnings: string[];
}

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
  return { step: step.step ?? null, committed: step.commit.committed, layout: step.layout, arrays, warnings: [...step.warnings] };
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

export async function runInspect(location: string, options: InspectOptions, out: Output): Promise<number> {
  const step = await openStep(location, options.step === undefined ? {} : { step: options.step });
  for (const w of step.warnings) out.warn(w);
  const total = step.leaves.filter((l) => l.isArray).length;
  const progress = options.checksums ? out.progress("hashing arrays", total) : undefined;
  const report = await inspectStep(step, { checksums: options.checksums ?? false, onArray: (done) => progress?.update(done) });
  progress?.done();
  if (options.json) {
    const { warnings: _w, ...rest } = report;
    out.stdout(JSON.stringify(rest, null, 2));
    return 0;
  }
  const rows = report.arrays.map((a) => {
    const row = [a.path, a.dtype, formatShape(a.shape), formatShape(a.chunkShape), String(a.chunks), formatBytes(a.storedBytes), a.storage];
    if (options.checksums) row.push(a.sha256 ?? "");
    return row;
  });
  const header = ["path", "dtype", "shape", "chunk shape", "chunks", "stored", "storage"];
  if (options.checksums) header.push("sha256");
  out.stdout(table(header, rows, new Set([4, 5])));
  const bytes = report.arrays.reduce((s, a) => s + a.storedBytes, 0);
  const chunks = report.arrays.reduce((s, a) => s + a.chunks, 0);
  const others = step.leaves.filter((l) => !l.isArray);
  out.stdout("");
  out.stdout(
    `${report.arrays.length} arrays, ${chunks} chunks, ${formatBytes(bytes)} stored` +
      (others.length ? `; ${others.length} non-array leaves` : ""),
  );
  out.stdout(
    `step ${report.step ?? "?"}, layout ${report.layout}, ${report.committed ? `committed (${step.commit.marker})` : `NOT committed: ${step.commit.reason}`}`,
  );
  if (step.iteratorFiles.length)
    out.stdout(`${step.iteratorFiles.length} iterator file(s): ${step.iteratorFiles.map((f) => f.key).join(", ")}`);
  return 0;
}
