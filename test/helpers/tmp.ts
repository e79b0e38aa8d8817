import { cpSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export function tempDir(label = "t"): string {
  return mkdtempSync(join(tmpdir(), `orbax2reg-${label}-`));
}

/** A checkpoint root holding copies of `step` under each of `names`. */
export function rootWithSteps(step: string, names: string[]): string {
  const root = tempDir("root");
  for (const n of names) cpSync(step, join(root, n), { recursive: true });
  return root;
}
