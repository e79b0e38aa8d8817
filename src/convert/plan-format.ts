import { MetadataError } from "../errors.js";
import { regularChunkKey } from "../regular/zarray.js";
import type { BuildIdentity } from "../version.js";
import type { CastDtype } from "../zarr/cast.js";
import { chunkGrid, product } from "../zarr/metadata.js";

/**
 * The plan: everything a convert-group job needs, written once by `plan` under the destination step's
 * hidden prefix so that any number of machines can execute groups of it independently. Versioned; a
 * reader refuses versions it does not know.
 *
 * On disk it is split so that no reader holds more than a part of it: `plan.json` is a small head (identity,
 * source, destination, the groups' ranges and totals: what ownership checks and `cloud status` read); each
 * group's objects are parts of at most `partObjects` objects each (`plans/<id>/group-G/part-P.json`), written
 * as they fill; what only finalize needs (iterator files, the index, every array) is the commit part, written
 * last (a plan whose commit part is there has all its parts). Records are kept per part, so every phase
 * loads, checks and drops one part at a time. The keys are in work-dir.ts.
 */
export const PLAN_FORMAT = "orbax2reg-plan";
/**
 * 2: plans carry an id; objects count only when a record of that plan vouches for them (records.ts).
 * 3: the plan is a head plus one part per group and a commit part; records are kept per group.
 * 4: each group is parts of at most `partObjects` objects; records are kept per part.
 * 5: an export may be cast (`options.dtype`, arrays' `castTo`, the `cast` transform): an older reader would not
 *    know how to make those objects.
 */
export const PLAN_VERSION = 5;
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
 * - fill: a chunk absent from the source because it equals the fill value: encode that fill (cast, when the
 *   array is);
 * - cast: decode with the source array's codecs, cast the elements to the array's `castTo`, encode as one zstd
 *   level-1 zarr v2 chunk.
 */
export type Transform = "copy" | "shard-inner" | "transcode" | "fill" | "cast";

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
  /**
   * Index into `plan.arrays` for transcode, fill and cast, and for chunks passed through (copy, shard-inner:
   * their zstd frame header is checked against the chunk's shape). Absent for `.zarray` objects.
   */
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
  /** The dtype the array is written as when the export casts it (`--dtype`); absent: the source's. */
  readonly castTo?: CastDtype;
}

export interface PlannedFile {
  /** Key in the source store. */
  readonly source: string;
  /** Key relative to the destination step directory. */
  readonly target: string;
  readonly size: number;
}

export interface PlanGroup {
  /** Objects `[start, end)` of the plan, in group order, belong to this group. */
  readonly start: number;
  readonly end: number;
  /** Its parts: `ceil((end - start) / partObjects)`, each full but the last. */
  readonly parts: number;
  readonly bytes: number;
  readonly arrays: number;
}

/** What the user chose about the export's contents. */
export interface PlanChoices {
  /** Only `model/...` and `prng_key` (plan.ts, keptByParamsOnly). */
  readonly paramsOnly: boolean;
  /** Floating-point leaves of 32 or 64 bits are written as this dtype; absent: every leaf as stored. */
  readonly dtype?: CastDtype;
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
  readonly options: PlanChoices;
  readonly arrays: readonly PlannedArray[];
  readonly groups: readonly PlanGroup[];
  /** Objects per part (the last part of a group may hold fewer). */
  readonly partObjects: number;
  /** Iterator files, copied by finalize. */
  readonly files: readonly PlannedFile[];
  /** The index file's exact text, written last by finalize. */
  readonly index: string;
  readonly totals: { readonly arrays: number; readonly objects: number; readonly bytes: number };
  /**
   * Which orbax2reg wrote the plan (src/version.ts), for a person tracing a result: no reader acts on it, so
   * it needs no new version (older readers ignore it; plans written before 0.2.0 lack it).
   */
  readonly writtenBy?: BuildIdentity;
}

/** What `plan.json` holds: the plan without its arrays, iterator files and index (the commit part's). */
export type PlanHead = Omit<Plan, "arrays" | "files" | "index">;

/** What a writer needs of a plan: where, under which id, and the arrays its transcode and fill objects name. */
export type ExecutionPlan = Pick<Plan, "id" | "source" | "destination" | "arrays">;

/** Which part: part `part` of group `group`. */
export interface PartRef {
  readonly group: number;
  readonly part: number;
}

/** One part of a plan as a writer reads it: the head, its objects, and only the arrays they name. */
export interface PlanPart extends PlanHead, PartRef {
  /** Sparse: indexed like the full plan's arrays, holding those this part's objects name. */
  readonly arrays: readonly PlannedArray[];
  readonly objects: readonly PlannedObject[];
}

interface PartText {
  readonly plan: string;
  readonly group: number;
  readonly part: number;
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
  const { format, version, id, createdAt, source, destination, step, options, groups, partObjects, totals, writtenBy } = plan;
  const head = { format, version, id, createdAt, source, destination, step, options, groups, partObjects, totals };
  return writtenBy === undefined ? head : { ...head, writtenBy };
}

/** The parts of group `g`: which objects of the group each holds. */
export function partRanges(plan: Pick<PlanHead, "groups" | "partObjects">, g: number): { part: number; start: number; end: number }[] {
  const group = plan.groups[g] as PlanGroup;
  const size = group.end - group.start;
  const out: { part: number; start: number; end: number }[] = [];
  for (let p = 0; p < group.parts; p++) out.push({ part: p, start: p * plan.partObjects, end: Math.min(size, (p + 1) * plan.partObjects) });
  return out;
}

/** Objects per piece of a part's text. */
const OBJECTS_PER_PIECE = 1024;

/** The text of part `ref` of plan `id` holding `objects`, in pieces (a part of 16k objects is ~3 MB of text). */
export function* partPieces(
  id: string,
  ref: PartRef,
  arrays: readonly PlannedArray[],
  objects: readonly PlannedObject[],
): Iterable<string> {
  const named = new Set<number>();
  for (const o of objects) if (o.array !== undefined) named.add(o.array);
  const used = [...named].sort((a, b) => a - b).map((i) => [i, arrays[i] as PlannedArray] as const);
  yield `{"plan":${JSON.stringify(id)},"group":${ref.group},"part":${ref.part},"arrays":${JSON.stringify(used)},"objects":[`;
  for (let i = 0; i < objects.length; i += OBJECTS_PER_PIECE) {
    const text = JSON.stringify(objects.slice(i, i + OBJECTS_PER_PIECE));
    yield `${i === 0 ? "" : ","}${text.slice(1, -1)}`;
  }
  yield "]}";
}

/** The text of the commit part of `plan` under id `id`. */
export function commitText(plan: Pick<Plan, "arrays" | "files" | "index">, id: string): string {
  const commit: CommitPart = { plan: id, arrays: plan.arrays, files: plan.files, index: plan.index };
  return JSON.stringify(commit);
}

function parseJson(text: string, path: string, what: string): unknown {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new MetadataError(`${what} is not valid JSON (${(e as Error).message})`, { path });
  }
}

/** Reads part `ref` of plan `head`. */
export function parsePart(head: PlanHead, ref: PartRef, text: string, path: string): PlanPart {
  const p = parseJson(text, path, "plan part") as Partial<PartText> | null;
  if (p?.plan !== head.id || p.group !== ref.group || p.part !== ref.part || !Array.isArray(p.objects) || !Array.isArray(p.arrays)) {
    throw new MetadataError(`not part ${ref.part} of group ${ref.group} of plan ${head.id}`, { path });
  }
  const arrays: PlannedArray[] = [];
  for (const [i, a] of p.arrays) arrays[i] = a;
  return { ...head, ...ref, arrays, objects: p.objects };
}

/** The plan (all but its objects) from its head and its commit part. */
export function parseCommitPart(head: PlanHead, text: string, path: string): Plan {
  const c = parseJson(text, path, "plan part") as Partial<CommitPart> | null;
  if (c?.plan !== head.id || !Array.isArray(c.arrays) || !Array.isArray(c.files) || typeof c.index !== "string") {
    throw new MetadataError(`not the commit part of plan ${head.id}`, { path });
  }
  return { ...head, arrays: c.arrays, files: c.files, index: c.index };
}

/**
 * Whether `target` (relative to the step) is an object a plan with these arrays writes: an array's `.zarray`
 * or a chunk of its grid. Decided from the arrays alone, so that finalize and retreat need no set of every
 * planned target (a step may have millions).
 */
export function plannedTargets(arrays: readonly Pick<PlannedArray, "path" | "shape" | "chunkShape">[]): (target: string) => boolean {
  const grids = new Map<string, { grid: number[]; count: number }>();
  for (const a of arrays) {
    const grid = chunkGrid({ shape: a.shape, chunkShape: a.chunkShape });
    grids.set(`gda/${a.path}`, { grid, count: product(grid) });
  }
  return (target) => {
    const slash = target.lastIndexOf("/");
    const g = grids.get(target.slice(0, slash));
    if (g === undefined) return false;
    const name = target.slice(slash + 1);
    if (name === ".zarray") return true;
    const parts = name.split(".");
    if (g.grid.length === 0) return name === regularChunkKey([]);
    if (parts.length !== g.grid.length) return false;
    const index = parts.map((x) => (/^(0|[1-9]\d*)$/.test(x) ? Number(x) : -1));
    return index.every((v, d) => v >= 0 && v < (g.grid[d] as number)) && regularChunkKey(index) === name;
  };
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
    const older = typeof p.version === "number" && p.version < PLAN_VERSION;
    throw new MetadataError(
      `plan version ${JSON.stringify(p.version)} is not supported (this orbax2reg reads version ${PLAN_VERSION})${older ? "; it was written by an older orbax2reg: plan the step again with --force" : ""}`,
      { path, key: "version" },
    );
  }
  for (const field of ["id", "source", "destination", "groups", "partObjects", "totals"] as const) {
    if (p[field] === undefined) throw new MetadataError("missing field", { path, key: field });
  }
  return p as PlanHead;
}
