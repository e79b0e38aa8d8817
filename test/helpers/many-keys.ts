import { cpSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { OcdbtDatabase } from "../../src/ocdbt/database.js";
import { LocalStore } from "../../src/store/local.js";
import { DataFileBuilder, envelope, type InteriorEntry, interiorBody, type LeafEntry, leafBody, manifestBody } from "./ocdbt-encode.js";
import { tempDir } from "./tmp.js";

/** Keys per leaf node: about 100 KiB a leaf, a few hundred leaves for a million keys (as a real database splits them). */
const PER_LEAF = 4096;

/**
 * A copy of the step at `step` whose `state/` database holds its own keys (their values made inline) plus
 * `extra` empty keys outside every array's grid (`prng_key/1`, `prng_key/2`, ...: prng_key's grid has one
 * chunk), in a two-level b-tree: the shape of a step that a buggy or hostile writer padded with keys.
 */
export function stepWithExtraKeys(step: string, extra: number): Promise<string> {
  return rewrittenStep(step, (entries) => {
    for (let i = 1; i <= extra; i++) entries.push({ key: `prng_key/${i}`, value: new Uint8Array(0) });
    return entries;
  });
}

/**
 * A copy of the step at `step` (AXLearn's layout, one state database) whose database holds what `edit` makes of
 * its entries (values made inline), written as a two-level b-tree; `_METADATA` is `editMetadata`'s text.
 */
export async function rewrittenStep(
  step: string,
  edit: (entries: { key: string; value: Uint8Array }[]) => { key: string; value: Uint8Array }[],
  editMetadata: (text: string) => string = (t) => t,
): Promise<string> {
  const root = tempDir("rewritten");
  const copy = join(root, "step_00000100");
  cpSync(step, copy, { recursive: true });
  const state = join(copy, "state");
  const db = await OcdbtDatabase.open(new LocalStore(state));
  const original: { key: string; value: Uint8Array }[] = [];
  for await (const e of db.list()) original.push({ key: e.key, value: await db.readValue(e.value) });
  const entries = edit(original);
  // Byte order, as OCDBT sorts keys (for ASCII keys, string order).
  const utf8 = new TextEncoder();
  entries.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  if (entries.some((e) => /[\u0080-\uffff]/.test(e.key))) entries.sort((a, b) => Buffer.compare(utf8.encode(a.key), utf8.encode(b.key)));

  const file = new DataFileBuilder();
  const children: InteriorEntry[] = [];
  for (let at = 0; at < entries.length; at += PER_LEAF) {
    const leaf: LeafEntry[] = entries.slice(at, at + PER_LEAF);
    const where = file.add(envelope("btreeNode", leafBody([], leaf)));
    children.push({ key: (leaf[0] as LeafEntry).key, file: 0, ...where, numKeys: leaf.length });
  }
  const rootNode = file.add(envelope("btreeNode", interiorBody(1, [["", "d/rewritten"]], children)));
  rmSync(join(state, "ocdbt.process_0"), { recursive: true });
  rmSync(join(state, "d"), { recursive: true });
  mkdirSync(join(state, "d"));
  writeFileSync(join(state, "d", "rewritten"), file.bytes());
  const version = { generation: 1, rootHeight: 1, file: 0, ...rootNode, numKeys: entries.length };
  writeFileSync(join(state, "manifest.ocdbt"), envelope("manifest", manifestBody({}, [["", "d/rewritten"]], [version])));
  writeFileSync(join(state, "_METADATA"), editMetadata(readFileSync(join(state, "_METADATA"), "utf8")));
  return copy;
}
