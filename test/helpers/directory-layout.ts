// A fixture step whose chunks a test can rewrite: the PyTree item re-stored in Orbax's per-parameter directory
// layout (use_ocdbt=False: `<item>/<param>/.zarray` and one file per chunk), with the step's index, metadata
// and commit markers as they are. In the OCDBT layout a small chunk sits inside a B+tree node under its
// CRC-32C, so it cannot be replaced by writing a file.
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { openStep } from "../../src/orbax/step.js";
import { copyOf } from "./convert.js";

/** A copy of `step` (whose item is `state/`) in the directory layout; returns the copy's step directory. */
export async function directoryLayoutCopy(step: string, label: string): Promise<string> {
  const source = await openStep(step);
  const copy = copyOf(step, label);
  const item = join(copy, "state");
  for (const name of readdirSync(item))
    if (name === "manifest.ocdbt" || name === "d" || name.startsWith("ocdbt.process_")) rmSync(join(item, name), { recursive: true });
  for await (const e of source.source.list("")) {
    const path = join(item, ...e.key.split("/"));
    mkdirSync(join(path, ".."), { recursive: true });
    writeFileSync(path, await source.source.read(e.value));
  }
  // An OCDBT save's _METADATA says so; a directory-layout save's does not.
  const meta = JSON.parse(readFileSync(join(item, "_METADATA"), "utf8"));
  meta.use_ocdbt = false;
  writeFileSync(join(item, "_METADATA"), JSON.stringify(meta));
  return copy;
}
