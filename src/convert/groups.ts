/** A run of objects that stays together in one group (one array, or a slice of a large array's chunks). */
export interface Unit<T> {
  readonly items: readonly T[];
  readonly bytes: number;
  readonly array: number;
}

/**
 * Splits arrays into `n` groups balanced by bytes: the largest unit first, each into the lightest group
 * (LPT scheduling). An array larger than a group's share is first cut into runs of consecutive chunks of
 * at most that share, so one huge array spreads over several machines.
 */
export function balance<T>(arrays: readonly { items: readonly T[]; sizes: readonly number[] }[], n: number): Unit<T>[][] {
  const total = arrays.reduce((s, a) => s + a.sizes.reduce((x, y) => x + y, 0), 0);
  const share = Math.max(1, Math.ceil(total / n));
  const units: Unit<T>[] = [];
  arrays.forEach((a, array) => {
    let start = 0;
    let bytes = 0;
    for (let i = 0; i < a.items.length; i++) {
      const size = a.sizes[i] as number;
      if (i > start && bytes + size > share) {
        units.push({ items: a.items.slice(start, i), bytes, array });
        start = i;
        bytes = 0;
      }
      bytes += size;
    }
    if (a.items.length > start) units.push({ items: a.items.slice(start), bytes, array });
  });
  const groups: Unit<T>[][] = Array.from({ length: n }, () => []);
  const load = new Array<number>(n).fill(0);
  for (const u of [...units].sort((x, y) => y.bytes - x.bytes)) {
    let best = 0;
    for (let g = 1; g < n; g++) if ((load[g] as number) < (load[best] as number)) best = g;
    groups[best]?.push(u);
    load[best] = (load[best] as number) + u.bytes;
  }
  return groups;
}
