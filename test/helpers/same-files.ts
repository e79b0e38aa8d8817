import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { expect } from "vitest";

/** `got` holds the same file names as `want`, byte for byte: nothing more (no partial or scratch object), nothing less. */
export function expectSameFiles(got: string, want: string): void {
  const names = readdirSync(want).sort();
  expect(readdirSync(got).sort()).toEqual(names);
  for (const n of names) expect(Buffer.compare(readFileSync(join(got, n)), readFileSync(join(want, n))), n).toBe(0);
}
