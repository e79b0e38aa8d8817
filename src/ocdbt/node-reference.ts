import type { ByteReader } from "./byte-reader.js";
import { type DataFileId, readDataFileRef } from "./data-file-table.js";

/** A byte range of a data file holding one encoded node (or, in a leaf, one raw value). */
export interface IndirectRef {
  readonly file: DataFileId;
  readonly offset: number;
  readonly length: number;
}

/** Statistics stored beside every B+tree reference; they describe the subtree and are not needed to read. */
export interface SubtreeStats {
  readonly numKeys: number;
  readonly numTreeBytes: number;
  readonly numIndirectValueBytes: number;
}

const MISSING = (1n << 64n) - 1n;
const MAX_OFFSET = (1n << 63n) - 1n;

/**
 * Reads `n` (file, offset, length) triples in column order. When `allowMissing` is set (version entries
 * only), offset = length = 2^64-1 marks an empty tree and yields `null`.
 */
export function readIndirectRefColumns(
  r: ByteReader,
  n: number,
  files: readonly DataFileId[],
  allowMissing: boolean,
  what: string,
): (IndirectRef | null)[] {
  const ids: DataFileId[] = [];
  for (let i = 0; i < n; i++) ids.push(readDataFileRef(r, files, `${what} data file index`));
  const offsets: bigint[] = [];
  for (let i = 0; i < n; i++) offsets.push(r.varintBig(`${what} offset`));
  const refs: (IndirectRef | null)[] = [];
  for (let i = 0; i < n; i++) {
    const at = r.offset;
    const length = r.varintBig(`${what} length`);
    const offset = offsets[i] as bigint;
    if (offset === MISSING && length === MISSING) {
      if (!allowMissing) r.fail(`${what} ${i}: empty-tree marker is only allowed in version entries`, at);
      refs.push(null);
      continue;
    }
    if (offset + length > MAX_OFFSET || offset + length > BigInt(Number.MAX_SAFE_INTEGER)) {
      r.fail(`${what} ${i}: byte range ${offset}+${length} is out of range`, at);
    }
    refs.push({ file: ids[i] as DataFileId, offset: Number(offset), length: Number(length) });
  }
  return refs;
}

export function readStatsColumns(r: ByteReader, n: number, what: string): SubtreeStats[] {
  const numKeys = column(r, n, `${what} num_keys`);
  const numTreeBytes = column(r, n, `${what} num_tree_bytes`);
  const numIndirectValueBytes = column(r, n, `${what} num_indirect_value_bytes`);
  return numKeys.map((k, i) => ({
    numKeys: k,
    numTreeBytes: numTreeBytes[i] as number,
    numIndirectValueBytes: numIndirectValueBytes[i] as number,
  }));
}

function column(r: ByteReader, n: number, what: string): number[] {
  const out: number[] = [];
  for (let i = 0; i < n; i++) out.push(r.varint(what));
  return out;
}
