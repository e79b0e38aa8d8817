/** A run of objects that stays together in one group (one array, or a slice of a large array's chunks). */
export interface Unit<T> {
  readonly items: readonly T[];
  readonly bytes: number;
  readonly array: number;
}

/** A unit as a range of its array's objects: `[start, end)`. */
export interface UnitRange {
  readonly array: number;
  readonly start: number;
  readonly end: number;
  readonly bytes: number;
}

/**
 * Splits arrays into `n` groups balanced by bytes: the largest unit first, each into the lightest group
 * (LPT scheduling). An array larger than a group's share is first cut into runs of consecutive chunks of
 * at most that share, so one huge array spreads over several machines.
 */
export function balance<T>(arrays: readonly { items: readonly T[]; sizes: readonly number[] }[], n: number): Unit<T>[][] {
  return balanceRanges(
    arrays.map((a) => a.sizes),
    n,
  ).map((g) =>
    g.map((u) => ({ items: (arrays[u.array] as { items: readonly T[] }).items.slice(u.start, u.end), bytes: u.bytes, array: u.array })),
  );
}

/** balance, given only each array's object sizes: the units as ranges of their array's objects. */
export function balanceRanges(sizes: readonly ArrayLike<number>[], n: number): UnitRange[][] {
  let total = 0;
  for (const a of sizes) for (let i = 0; i < a.length; i++) total += a[i] as number;
  const share = Math.max(1, Math.ceil(total / n));
  const units: UnitRange[] = [];
  sizes.forEach((a, array) => {
    let start = 0;
    let bytes = 0;
    for (let i = 0; i < a.length; i++) {
      const size = a[i] as number;
      if (i > start && bytes + size > share) {
        units.push({ array, start, end: i, bytes });
        start = i;
        bytes = 0;
      }
      bytes += size;
    }
    if (a.length > start) units.push({ array, start, end: a.length, bytes });
  });
  const groups: UnitRange[][] = Array.from({ length: n }, () => []);
  const load = new Array<number>(n).fill(0);
  for (const u of [...units].sort((x, y) => y.bytes - x.bytes)) {
    let best = 0;
    for (let g = 1; g < n; g++) if ((load[g] as number) < (load[best] as number)) best = g;
    groups[best]?.push(u);
    load[best] = (load[best] as number) + u.bytes;
  }
  return groups;
}
