import { MetadataError } from "../errors.js";
import { commitPartKey, groupPartKey } from "./work-dir.js";

/**
 * The plan: everything a convert-group job needs, written once by `plan` under the destination step's
 * hidden prefix so that any number of machines can execute groups of it independently. Versioned; a
 * reader refuses versions it does not know.
 *
 * On disk it is split so that a group's cost follows its own objects: `plan.json` is a small head (identity,
 * source, destination, the groups' ranges and totals: what ownership checks and `cloud status` read), each
 * group's objects are a part of their own, and what only finalize needs (iterator files, the index, every
 * array) is another; parts live under the plan's id (`plans/<id>/`), written by the plan's owner once its
 * head is on record, the commit part last (ownership.ts). The keys are in work-dir.ts.
 */
export const PLAN_FORMAT = "orbax2reg-plan";
/**
 * 2: plans carry an id; objects count only when a record of that plan vouches for them (records.ts).
 * 3: the plan is a head plus one part per group and a commit part; records are kept per group.
 */
export const PLAN_VERSION = 3;
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

/** What `plan.json` holds: the plan without its objects, arrays, iterator files and index. */
export type PlanHead = Omit<Plan, "arrays" | "objects" | "files" | "index">;

/** What a writer needs of a plan: where, under which id, and the arrays its transcode and fill objects name. */
export type ExecutionPlan = Pick<Plan, "id" | "source" | "destination" | "arrays">;

/** One group of a plan as a convert-group reads it: the head, its objects, and only the arrays they name. */
export interface GroupPlan extends PlanHead {
  readonly group: number;
  /** Sparse: indexed like the full plan's arrays, holding those this group's objects name. */
  readonly arrays: readonly PlannedArray[];
  readonly objects: readonly PlannedObject[];
}

interface GroupPart {
  readonly plan: string;
  readonly group: number;
  readonly arrays: readonly (readonly [number, PlannedArray])[];
  readonly objects: readonly PlannedObject[];
}

interface CommitPart {
  readonly plan: string;
  readonly arrays: readonly PlannedArray[];
  readonly files: readonly PlannedFile[];
  readonly index: string;
}

/** The head of `plan`, its fields in a fixed order (id and source early, for a person reading it). */
export function planHead(plan: Plan | PlanHead): PlanHead {
  const { format, version, id, createdAt, source, destination, step, options, groups, totals } = plan;
  return { format, version, id, createdAt, source, destination, step, options, groups, totals };
}

/** Objects per piece of a group part's text. */
const OBJECTS_PER_PIECE = 1024;

/**
 * The parts of `plan` (keys relative to the destination step), one at a time, each as pieces of its JSON
 * text made as they are consumed: a group of 520k objects is a 105 MB text, which should never be one string.
 */
export function* planParts(plan: Plan): Iterable<{ key: string; pieces: Iterable<string> }> {
  for (const [g, range] of plan.groups.entries()) {
    yield { key: groupPartKey(plan.id, g), pieces: groupPartPieces(plan, g, range) };
  }
  const commit: CommitPart = { plan: plan.id, arrays: plan.arrays, files: plan.files, index: plan.index };
  yield { key: commitPartKey(plan.id), pieces: [JSON.stringify(commit)] };
}

/** JSON.stringify of group `g`'s part ({plan, group, arrays, objects}), in pieces. */
function* groupPartPieces(plan: Plan, g: number, range: PlanGroup): Iterable<string> {
  const named = new Set<number>();
  for (let i = range.start; i < range.end; i++) {
    const a = (plan.objects[i] as PlannedObject).array;
    if (a !== undefined) named.add(a);
  }
  const arrays = [...named].sort((a, b) => a - b).map((i) => [i, plan.arrays[i] as PlannedArray] as const);
  yield `{"plan":${JSON.stringify(plan.id)},"group":${g},"arrays":${JSON.stringify(arrays)},"objects":[`;
  for (let i = range.start; i < range.end; i += OBJECTS_PER_PIECE) {
    const slice = plan.objects.slice(i, Math.min(i + OBJECTS_PER_PIECE, range.end));
    const text = JSON.stringify(slice);
    yield `${i === range.start ? "" : ","}${text.slice(1, -1)}`;
  }
  yield "]}";
}

function parseJson(text: string, path: string, what: string): unknown {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new MetadataError(`${what} is not valid JSON (${(e as Error).message})`, { path });
  }
}

/** Reads one group's part of plan `head` into the group's plan. */
export function parseGroupPart(head: PlanHead, group: number, text: string, path: string): GroupPlan {
  const p = parseJson(text, path, "plan part") as Partial<GroupPart> | null;
  if (p?.plan !== head.id || p.group !== group || !Array.isArray(p.objects) || !Array.isArray(p.arrays)) {
    throw new MetadataError(`not group ${group}'s part of plan ${head.id}`, { path });
  }
  const arrays: PlannedArray[] = [];
  for (const [i, a] of p.arrays) arrays[i] = a;
  return { ...head, group, arrays, objects: p.objects };
}

/** The whole plan from its head, its commit part and every group's objects in group order. */
export function assemblePlan(head: PlanHead, commitText: string, commitPath: string, groups: readonly GroupPlan[]): Plan {
  const c = parseJson(commitText, commitPath, "plan part") as Partial<CommitPart> | null;
  if (c?.plan !== head.id || !Array.isArray(c.arrays) || !Array.isArray(c.files) || typeof c.index !== "string") {
    throw new MetadataError(`not the commit part of plan ${head.id}`, { path: commitPath });
  }
  const objects: PlannedObject[] = [];
  for (const g of groups) for (const o of g.objects) objects.push(o);
  return { ...head, arrays: c.arrays, objects, files: c.files, index: c.index };
}

/**
 * A plan head larger than this is not one to peek at: a head holds a few hundred bytes plus ~60 a group (plans
 * before version 3 held every object, many MB).
 */
export const MAX_PLAN_HEAD_BYTES = 1 << 20;

/** Whose a plan is and what it converts: the id and source of a plan head of any version, when it says. */
export interface PlanIdentity {
  readonly id: string | undefined;
  readonly source: { readonly root: string; readonly stepDir: string | undefined } | undefined;
}

/**
 * The id and source of a plan head's text, read leniently: any version, and fields that are missing or not
 * strings are undefined (ownership checks and retention only compare or report them; parsePlan is the strict read).
 */
export function planIdentity(text: string): PlanIdentity {
  let p: unknown;
  try {
    p = JSON.parse(text);
  } catch {
    return { id: undefined, source: undefined };
  }
  const str = (v: unknown) => (typeof v === "string" ? v : undefined);
  const head = (typeof p === "object" && p !== null ? p : {}) as { id?: unknown; source?: { root?: unknown; stepDir?: unknown } | null };
  const root = str(head.source?.root);
  return { id: str(head.id), source: root === undefined ? undefined : { root, stepDir: str(head.source?.stepDir) } };
}

/** Reads a plan head (`plan.json`). */
export function parsePlan(text: string, path: string): PlanHead {
  const p = parseJson(text, path, "plan") as Partial<PlanHead> | null;
  if (p?.format !== PLAN_FORMAT) throw new MetadataError("not an orbax2reg plan", { path, key: "format" });
  if (p.version !== PLAN_VERSION) {
    throw new MetadataError(`plan version ${JSON.stringify(p.version)} is not supported (this orbax2reg reads version ${PLAN_VERSION})`, {
      path,
      key: "version",
    });
  }
  for (const field of ["id", "source", "destination", "groups", "totals"] as const) {
    if (p[field] === undefined) throw new MetadataError("missing field", { path, key: field });
  }
  return p as PlanHead;
}
