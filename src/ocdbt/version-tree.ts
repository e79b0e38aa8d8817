import type { ByteReader } from "./byte-reader.js";
import type { DataFileId } from "./data-file-table.js";
import { type IndirectRef, readIndirectRefColumns, readStatsColumns, type SubtreeStats } from "./node-reference.js";

/** One committed version: the root of its B+tree (null for an empty tree) and when it was written. */
export interface VersionEntry {
  readonly generation: number;
  readonly rootHeight: number;
  readonly root: IndirectRef | null;
  readonly stats: SubtreeStats;
  /** Nanoseconds since the Unix epoch. */
  readonly commitTimeNs: bigint;
}

/** A reference from the manifest or an interior version-tree node to an older version-tree node. */
export interface VersionNodeRef {
  readonly generation: number;
  readonly ref: IndirectRef;
  readonly numGenerations: number;
  readonly commitTimeNs: bigint;
  readonly height: number;
}

/** Leaf entry array: the manifest's inline versions and the body of version-tree leaves. */
export function decodeVersionEntries(r: ByteReader, files: readonly DataFileId[], arityLog2: number): VersionEntry[] {
  const n = r.count("version count", 2 ** arityLog2, 1);
  const generations: number[] = [];
  for (let i = 0; i < n; i++) {
    const at = r.offset;
    const g = r.varint("generation_number");
    if (g === 0) r.fail("generation_number 0 is not allowed", at);
    if (i > 0 && g <= (generations[i - 1] as number)) r.fail(`generation numbers not increasing (${g})`, at);
    generations.push(g);
  }
  const rootHeights: number[] = [];
  for (let i = 0; i < n; i++) rootHeights.push(r.u8("root_height"));
  const roots = readIndirectRefColumns(r, n, files, true, "version root");
  const stats = readStatsColumns(r, n, "version");
  const commitTimes: bigint[] = [];
  for (let i = 0; i < n; i++) commitTimes.push(r.u64le("commit_time"));
  const out: VersionEntry[] = [];
  for (let i = 0; i < n; i++) {
    const root = roots[i] as IndirectRef | null;
    const st = stats[i] as SubtreeStats;
    if (
      root === null &&
      ((rootHeights[i] as number) !== 0 || st.numKeys !== 0 || st.numTreeBytes !== 0 || st.numIndirectValueBytes !== 0)
    ) {
      r.fail(`version ${generations[i]}: empty tree with non-zero height or statistics`);
    }
    out.push({
      generation: generations[i] as number,
      rootHeight: rootHeights[i] as number,
      root,
      stats: st,
      commitTimeNs: commitTimes[i] as bigint,
    });
  }
  return out;
}

/**
 * Interior entry array. In the manifest each entry carries its own height; inside a node every child has
 * the node's height minus one.
 */
export function decodeVersionNodeRefs(
  r: ByteReader,
  files: readonly DataFileId[],
  heights: { readonly inManifest: true } | { readonly inManifest: false; readonly childHeight: number },
  maxEntries: number,
): VersionNodeRef[] {
  const n = r.count("version node count", maxEntries, 1);
  const generations: number[] = [];
  for (let i = 0; i < n; i++) generations.push(r.varint("version node generation_number"));
  const refs = readIndirectRefColumns(r, n, files, false, "version node");
  const numGenerations: number[] = [];
  for (let i = 0; i < n; i++) numGenerations.push(r.varint("num_generations"));
  const commitTimes: bigint[] = [];
  for (let i = 0; i < n; i++) commitTimes.push(r.u64le("commit_time"));
  const entryHeights: number[] = [];
  for (let i = 0; i < n; i++) entryHeights.push(heights.inManifest ? r.u8("entry_height") : heights.childHeight);
  return generations.map((generation, i) => ({
    generation,
    ref: refs[i] as IndirectRef,
    numGenerations: numGenerations[i] as number,
    commitTimeNs: commitTimes[i] as bigint,
    height: entryHeights[i] as number,
  }));
}
