/** Small helpers for human-readable CLI output. */

import { printable } from "../errors.js";

export function formatBytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return u === 0 ? `${n} B` : `${v.toFixed(1)} ${units[u]}`;
}

export function formatShape(shape: readonly number[]): string {
  return `(${shape.join(", ")}${shape.length === 1 ? "," : ""})`;
}

/**
 * Left-aligned columns; columns listed in `right` are right-aligned (numbers). Within `width` (a terminal's),
 * a table that would be wider puts each row's first cell (a path, never cut) on a line of its own and the
 * other cells on the next, indented, aligned among themselves; if those are still too wide, the last cell (a
 * sha256) goes on a third line. Without `width` (a pipe, a file) every row stays one line, for grep and awk.
 * Cells are made printable (src/errors.ts): a key or a path is what a file put there.
 */
export function table(header: string[], cells: string[][], right: ReadonlySet<number> = new Set(), width = Infinity): string {
  const rows = cells.map((r) => r.map(printable));
  const flat = columns(header, rows, right);
  if (flat.width <= width || header.length < 2) return [flat.line(header), ...rows.map(flat.line)].join("\n");
  const shifted = (from: number) => new Set([...right].map((i) => i - from).filter((i) => i >= 0));
  let rest = columns(
    header.slice(1),
    rows.map((r) => r.slice(1)),
    shifted(1),
  );
  let last: number | undefined;
  if (INDENT.length + rest.width > width && header.length > 2) {
    last = header.length - 1;
    rest = columns(
      header.slice(1, last),
      rows.map((r) => r.slice(1, last)),
      shifted(1),
    );
  }
  const stacked = (cells: string[]) => [
    cells[0] as string,
    `${INDENT}${rest.line(cells.slice(1, last))}`,
    ...(last === undefined ? [] : [`${INDENT}${cells[last] ?? ""}`]),
  ];
  return [...stacked(header), ...rows.flatMap(stacked)].map((l) => l.trimEnd()).join("\n");
}

const INDENT = "  ";

/** Column widths over every row, the table's width, and how one row is laid out in them. */
function columns(header: string[], rows: string[][], right: ReadonlySet<number>) {
  // A loop, not Math.max(...rows): spreading a step's worth of rows into a call overflows the stack.
  const widths = header.map((h) => h.length);
  for (const r of rows) for (const [i, w] of widths.entries()) widths[i] = Math.max(w, (r[i] ?? "").length);
  const line = (cells: string[]) =>
    widths
      .map((w, i) => (right.has(i) ? (cells[i] ?? "").padStart(w) : (cells[i] ?? "").padEnd(w)))
      .join("  ")
      .trimEnd();
  return { width: widths.reduce((a, b) => a + b, 0) + 2 * Math.max(widths.length - 1, 0), line };
}
