import { printable } from "../errors.js";
import { inspectStep, type ProcessesReport } from "../orbax/inspect.js";
import { openStep } from "../orbax/step.js";
import { formatBytes, formatShape, table } from "./format.js";
import type { Output } from "./output.js";
import { CountProgress, progressMode } from "./progress.js";

export interface InspectOptions {
  json?: boolean;
  checksums?: boolean;
  step?: number;
  /** false with --no-progress. */
  progress?: boolean;
}

export async function runInspect(location: string, options: InspectOptions, out: Output): Promise<number> {
  const step = await openStep(location, options.step === undefined ? {} : { step: options.step });
  for (const w of step.warnings) out.warn(w);
  const total = step.leaves.filter((l) => l.isArray).length;
  const progress = options.checksums
    ? new CountProgress("hashing arrays", progressMode(options, out.isTTY), (line) => out.writeErr(`${line}\n`))
    : undefined;
  const report = await inspectStep(step, { checksums: options.checksums ?? false, onArray: (done) => progress?.update(done, total) });
  progress?.stop();
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
  out.stdout(table(header, rows, new Set([4, 5]), out.columns));
  const bytes = report.arrays.reduce((s, a) => s + a.storedBytes, 0);
  const chunks = report.arrays.reduce((s, a) => s + a.chunks, 0);
  const others = report.nonArrays;
  out.stdout("");
  out.stdout(
    `${report.arrays.length} arrays, ${chunks} chunks, ${formatBytes(bytes)} stored` +
      (others.length ? `; ${others.length} non-array ${others.length === 1 ? "leaf" : "leaves"}:` : ""),
  );
  // Named, with what _METADATA says they are: an input iterator saved as files, an empty node (None)...
  for (const o of others) out.stdout(printable(`  ${o.path}: ${o.valueType}${o.skipDeserialize ? " (skip_deserialize)" : ""}`));
  out.stdout(
    `step ${report.step ?? "?"}, layout ${report.layout}, ${report.committed ? `committed (${step.commit.marker})` : `NOT committed: ${step.commit.reason}`}`,
  );
  out.stdout(processesLine(report.processes));
  const p = report.processes;
  if (p.iterators.some((i) => i.files.length > 0)) {
    for (const i of p.iterators)
      out.stdout(printable(`process ${i.process} iterator files: ${i.files.length ? i.files.join(", ") : "none"}`));
  }
  if (p.missingIterators.length > 0) {
    out.warn(
      `the processes do not all have the same iterator files (${p.missingIterators.map((m) => `process ${m.process} lacks ${m.file}`).join("; ")}): convert refuses this step unless --params-only`,
    );
  }
  return 0;
}

/**
 * How many processes saved the step, and which of them have their own OCDBT database and array_metadatas:
 * the indices said as processes ("process 0", "processes 0, 1"), never a bare number that reads as a count.
 */
export function processesLine(p: ProcessesReport): string {
  const which = (xs: readonly number[]) => (xs.length === 0 ? "none" : `process${xs.length === 1 ? "" : "es"} ${xs.join(", ")}`);
  return `${p.count} process${p.count === 1 ? "" : "es"} saved it (own OCDBT database: ${which(p.databases)}; array_metadatas: ${which(p.arrayMetadatas)})`;
}
