/** Small helpers for human-readable CLI output. */

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

/** Left-aligned columns; columns listed in `right` are right-aligned (numbers). */
export function table(header: string[], rows: string[][], right: ReadonlySet<number> = new Set()): string {
  // A loop, not Math.max(...rows): spreading a step's worth of rows into a call overflows the stack.
  const widths = header.map((h) => h.length);
  for (const r of rows) for (const [i, w] of widths.entries()) widths[i] = Math.max(w, (r[i] ?? "").length);
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (right.has(i) ? c.padStart(widths[i] as number) : c.padEnd(widths[i] as number)))
      .join("  ")
      .trimEnd();
  return [line(header), ...rows.map(line)].join("\n");
}
