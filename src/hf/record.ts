import { createHash } from "node:crypto";

/**
 * The record an export keeps beside itself (`.orbax2reg-export.json`): what it exports (the source's chunk
 * locations, the dtype, the config), each shard's name, size and header, and each small file it writes besides
 * (config.json, generation_config.json, the tokenizer's) by name and sha256. Written before anything else, it
 * is what lets a rerun tell its own files from another checkpoint's, and `verify` check the small files.
 */
export const RECORD_NAME = ".orbax2reg-export.json";

/** This version's format tag; version 1 (before the small files were listed) named no files. */
const FORMAT = "orbax2reg export-hf 2";
const FORMAT_1 = "orbax2reg export-hf 1";

/** A small file of the export besides its shards, written after them and before the index. */
export interface ExportFile {
  readonly name: string;
  readonly bytes: Uint8Array;
}

export interface ShardEntry {
  readonly name: string;
  readonly bytes: number;
  /** sha256 of the shard's safetensors header, hex. */
  readonly header: string;
}

export interface FileEntry {
  readonly name: string;
  /** The file's size and sha256 (hex); undefined for the files a version 1 record wrote without naming them. */
  readonly bytes?: number;
  readonly sha256?: string;
}

export interface ExportRecord {
  readonly format: string;
  readonly source: { kind: string; step: number | null; fingerprint: unknown };
  readonly dtype: string;
  readonly config: Record<string, unknown>;
  readonly shards: readonly ShardEntry[];
  readonly files: readonly FileEntry[];
}

export const sha256 = (bytes: Uint8Array): string => createHash("sha256").update(bytes).digest("hex");

/** The record of an export, as written. */
export function makeRecord(
  fields: Omit<ExportRecord, "format" | "shards" | "files">,
  shards: readonly { name: string; fileBytes: number; header: Uint8Array }[],
  files: readonly ExportFile[],
): ExportRecord {
  return {
    format: FORMAT,
    ...fields,
    shards: shards.map((s) => ({ name: s.name, bytes: s.fileBytes, header: sha256(s.header) })),
    files: files.map((f) => ({ name: f.name, bytes: f.bytes.length, sha256: sha256(f.bytes) })),
  };
}

export function recordText(record: ExportRecord): string {
  return `${JSON.stringify(record, null, 2)}\n`;
}

/**
 * The files a record found at a destination names (its shards, its small files), or undefined when the text is
 * not a record of a version this reads: then it names nothing, and whatever it sits beside is nobody's.
 */
export function parseRecord(text: string): { shards: ShardEntry[]; files: FileEntry[] } | undefined {
  let json: { format?: unknown; shards?: unknown; files?: unknown };
  try {
    json = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (typeof json !== "object" || json === null || !Array.isArray(json.shards)) return undefined;
  const shards = json.shards.filter(
    (s): s is ShardEntry => typeof s?.name === "string" && typeof s.bytes === "number" && typeof s.header === "string",
  );
  if (json.format === FORMAT_1) return { shards, files: [{ name: "config.json" }, { name: "generation_config.json" }] };
  if (json.format !== FORMAT || !Array.isArray(json.files)) return undefined;
  const files = json.files.filter(
    (f): f is FileEntry => typeof f?.name === "string" && typeof f.bytes === "number" && typeof f.sha256 === "string",
  );
  return { shards, files };
}
