import { MetadataError } from "../errors.js";

/**
 * The plan: everything a convert-group job needs, written once by `plan` under the destination step's
 * hidden prefix so that any number of machines can execute groups of it independently. Versioned; a
 * reader refuses versions it does not know.
 */
export const PLAN_FORMAT = "orbax2reg-plan";
/** 2: plans carry an id; objects count only when a record of that plan vouches for them (records.ts). */
export const PLAN_VERSION = 2;
/** Hidden prefix inside the destination step for the plan and per-group reports. */
export const WORK_DIR = ".orbax2reg";
export const PLAN_KEY = `${WORK_DIR}/plan.json`;
/** The trigger function's once-per-step claim (src/cloud/trigger-handler.ts); deleting it allows a re-run. */
export const CLAIM_KEY = `${WORK_DIR}/claim.json`;

/** Bytes to read: a literal (inline OCDBT values, synthesized metadata) or a range of a source object. */
export type DataRef =
  | { readonly kind: "inline"; readonly base64: string }
  | { readonly kind: "range"; readonly key: string; readonly offset: number; readonly length: number };

/**
 * How a target object's bytes come from its data:
 * - copy: verbatim (zarr v2 chunks and metadata: Orbax and AXLearn write identical bytes);
 * - shard-inner: a zarr v3 shard holding one inner chunk; the target is the inner chunk's zstd frame,
 *   checked against the shard index (and its CRC-32C) at the end of the data;
 * - transcode: decode with the source array's codecs, re-encode as one zstd level-1 zarr v2 chunk;
 * - fill: a chunk absent from the source because it equals the fill value: encode that fill.
 */
export type Transform = "copy" | "shard-inner" | "transcode" | "fill";

/** Bytes a data reference holds (for inline data: the decoded base64, padding excluded). */
export function dataLength(d: DataRef): number {
  if (d.kind === "range") return d.length;
  const padding = d.base64.endsWith("==") ? 2 : d.base64.endsWith("=") ? 1 : 0;
  return (d.base64.length / 4) * 3 - padding;
}

export interface PlannedObject {
  /** Key relative to the destination step directory (e.g. `gda/model/w/0.1`). */
  readonly target: string;
  readonly data: DataRef;
  readonly transform: Transform;
  /** Index into `plan.arrays` for transcode and fill. */
  readonly array?: number;
  /** Exact size of the written object when known in advance (copy, shard-inner); null otherwise. */
  readonly size: number | null;
}

export interface PlannedArray {
  readonly path: string;
  readonly name: string;
  readonly dtype: string;
  readonly shape: readonly number[];
  readonly chunkShape: readonly number[];
  /** The source's `.zarray` or `zarr.json`, verbatim (transcode and fill re-read it). */
  readonly sourceMetadataKind: ".zarray" | "zarr.json";
  readonly sourceMetadata: string;
  readonly bytes: number;
}

export interface PlannedFile {
  /** Key in the source store. */
  readonly source: string;
  /** Key relative to the destination step directory. */
  readonly target: string;
  readonly size: number;
}

export interface PlanGroup {
  /** `objects[start, end)` belong to this group. */
  readonly start: number;
  readonly end: number;
  readonly bytes: number;
  readonly arrays: number;
}

export interface Plan {
  readonly format: typeof PLAN_FORMAT;
  readonly version: typeof PLAN_VERSION;
  /**
   * Random, unique per plan written: whoever's plan is on record in the destination step owns it. Writers
   * record their objects under this id and finalize commits only while this plan is on record.
   */
  readonly id: string;
  readonly createdAt: string;
  readonly source: {
    /** The source store's root URL; data keys are relative to it. */
    readonly root: string;
    readonly stepDir: string;
    readonly layout: string;
    /** Identity of the source contents (hash of the root manifests and metadata). */
    readonly fingerprint: string;
  };
  readonly destination: {
    readonly root: string;
    /** `step_%08d`, relative to the destination root. */
    readonly stepDir: string;
  };
  readonly step: number;
  readonly options: { readonly paramsOnly: boolean };
  readonly arrays: readonly PlannedArray[];
  readonly objects: readonly PlannedObject[];
  readonly groups: readonly PlanGroup[];
  /** Iterator files, copied by finalize. */
  readonly files: readonly PlannedFile[];
  /** The index file's exact text, written last by finalize. */
  readonly index: string;
  readonly totals: { readonly arrays: number; readonly objects: number; readonly bytes: number };
}

export function parsePlan(text: string, path: string): Plan {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new MetadataError(`plan is not valid JSON (${(e as Error).message})`, { path });
  }
  const p = json as Partial<Plan> | null;
  if (p?.format !== PLAN_FORMAT) throw new MetadataError("not an orbax2reg plan", { path, key: "format" });
  if (p.version !== PLAN_VERSION) {
    throw new MetadataError(`plan version ${JSON.stringify(p.version)} is not supported (this orbax2reg reads version ${PLAN_VERSION})`, {
      path,
      key: "version",
    });
  }
  for (const field of ["id", "source", "destination", "arrays", "objects", "groups", "files", "index"] as const) {
    if (p[field] === undefined) throw new MetadataError("missing field", { path, key: field });
  }
  return p as Plan;
}
