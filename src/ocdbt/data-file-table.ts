import type { ByteReader } from "./byte-reader.js";

/**
 * Where a data file lives, relative to the database root: `basePath + relativePath`. The split matters
 * only for nodes, whose own tables are relative to the base path they were fetched through (a merged
 * Orbax root points into `ocdbt.process_<i>/` this way).
 */
export interface DataFileId {
  readonly basePath: string;
  readonly relativePath: string;
}

export function dataFilePath(id: DataFileId): string {
  return id.basePath + id.relativePath;
}

const MAX_PATH_LENGTH = 65535;
const utf8 = new TextDecoder("utf-8");

/**
 * Decodes a prefix-compressed data-file table (OCDBT spec "Data file table format"). `transitivePath` is
 * the base path of the reference the enclosing node was read through ("" for the manifest); it is
 * prepended to every base path, as TensorStore's ReadDataFileTable does.
 */
export function decodeDataFileTable(r: ByteReader, transitivePath: string): DataFileId[] {
  const n = r.count("data file count", Number.MAX_SAFE_INTEGER, 2);
  if (n === 0) return [];
  const prefixLengths = [0];
  for (let i = 1; i < n; i++) prefixLengths.push(r.varint16("data file path prefix length"));
  const suffixLengths: number[] = [];
  for (let i = 0; i < n; i++) suffixLengths.push(r.varint16("data file path suffix length"));
  const baseLengths: number[] = [];
  for (let i = 0; i < n; i++) baseLengths.push(r.varint16("data file base path length"));

  const files: DataFileId[] = [];
  let prev = new Uint8Array(0);
  let prevBaseLength = 0;
  for (let i = 0; i < n; i++) {
    const prefix = prefixLengths[i] as number;
    const suffix = suffixLengths[i] as number;
    const baseLength = baseLengths[i] as number;
    const at = r.offset;
    if (prefix > prev.length) r.fail(`data file ${i}: prefix length ${prefix} exceeds previous path length ${prev.length}`);
    const length = prefix + suffix;
    if (length > MAX_PATH_LENGTH - transitivePath.length) r.fail(`data file ${i}: path length ${length} too long`);
    if (baseLength > length) r.fail(`data file ${i}: base path length ${baseLength} exceeds path length ${length}`);
    // The shared prefix may reach into the relative path only when both entries have the same base path.
    if (i > 0 && prefix > Math.min(prevBaseLength, baseLength) && baseLength !== prevBaseLength) {
      r.fail(`data file ${i}: path prefix crosses differing base paths`, at);
    }
    const path = new Uint8Array(length);
    path.set(prev.subarray(0, prefix), 0);
    path.set(r.take(suffix, "data file path suffix"), prefix);
    files.push({
      basePath: transitivePath + utf8.decode(path.subarray(0, baseLength)),
      relativePath: utf8.decode(path.subarray(baseLength)),
    });
    prev = path;
    prevBaseLength = baseLength;
  }
  return files;
}

/** Reads a varint index into `files`, failing on an index past the table. */
export function readDataFileRef(r: ByteReader, files: readonly DataFileId[], what: string): DataFileId {
  const at = r.offset;
  const index = r.varint(what);
  const file = files[index];
  if (file === undefined) r.fail(`${what} ${index} is past the data file table (${files.length} entries)`, at);
  return file;
}
