import { joinKey, type ObjectInfo, type Store } from "../store/store.js";
import { mapLimited } from "../util/budget.js";
import type { PartRef, PlanHead, PlannedObject } from "./plan-format.js";
import { type Recorded, type Records, readRecords, sourceCrc, storedCrc } from "./records.js";

/**
 * Whether planned objects are in the destination step as written under their plan: the one check that
 * resume (execute: skip what is done) and finalize (commit only when everything is) share.
 */

/** Why a planned object is not done. */
export type Defect = "missing" | "unrecorded" | "size" | "checksum";

/** A planned object in place (what is stored, and whether a record of the plan already says so), or why not. */
export type Verdict = { readonly done: Recorded; readonly recorded: boolean } | { readonly defect: Defect };

export interface CheckOptions {
  /** Objects checked at once (each may read its stored bytes back, and its source's). */
  readonly concurrency: number;
  /**
   * Objects this process wrote or checked itself (target -> what it stored), each recorded durably before the
   * check: not read back from a local disk (GCS's own checksum costs nothing to compare), and their records not
   * read back either.
   */
  readonly mine?: Records;
  /**
   * Take over verbatim copies that no record vouches for when their stored bytes match their source (a
   * writer killed before recording them: resume). Without it such an object is "unrecorded".
   */
  readonly adopt?: boolean;
  /** The part of the plan `objects` are of: its records vouch for them (only its are read). */
  readonly part: PartRef;
}

/**
 * The objects under the destination step directory, keyed by their key relative to it; undefined when there
 * are more than `limit` (the listing stops at the first one past it).
 */
export async function listStep(
  destination: Store,
  stepDir: string,
  limit = Number.POSITIVE_INFINITY,
): Promise<Map<string, ObjectInfo> | undefined> {
  const existing = new Map<string, ObjectInfo>();
  for await (const o of destination.list(`${stepDir}/`)) {
    if (existing.size === limit) return undefined;
    existing.set(o.key.slice(stepDir.length + 1), o);
  }
  return existing;
}

/** Directories listed at once. */
const LIST_CONCURRENCY = 8;

/** A step of at most this many objects is listed whole: the first two pages of a GCS listing (1,000 each) tell. */
export const WHOLE_STEP_LISTING = 1_999;

/**
 * The objects under the directories `objects` are written to (each array's), keyed like listStep: what a
 * writer of part of a step needs, however large the rest of the step is. A step of few objects (a fresh
 * destination, or a small model) is listed whole, in one or two requests rather than one per array directory
 * (about 50 for a fuji model: round trips of tens of ms before the first object and after the last); a larger
 * one costs those two requests more.
 */
export async function listTargets(
  destination: Store,
  stepDir: string,
  objects: readonly PlannedObject[],
): Promise<Map<string, ObjectInfo>> {
  const whole = await listStep(destination, stepDir, WHOLE_STEP_LISTING);
  if (whole !== undefined) return whole;
  const dirs = new Set<string>();
  for (const o of objects) dirs.add(o.target.slice(0, o.target.lastIndexOf("/") + 1));
  const existing = new Map<string, ObjectInfo>();
  await mapLimited([...dirs], LIST_CONCURRENCY, async (dir) => {
    for await (const o of destination.list(`${stepDir}/${dir}`)) existing.set(o.key.slice(stepDir.length + 1), o);
  });
  return existing;
}

/**
 * The verdict on each of `objects` (in order), given the step's listing `existing`: in place when listed
 * with the size its record and the plan say and stored bytes whose CRC-32C equals the recorded one (or, for
 * a copy recorded without one, its source's); with `adopt`, also an unrecorded copy that matches its source.
 */
export async function checkObjects(
  plan: Pick<PlanHead, "id" | "destination">,
  objects: readonly PlannedObject[],
  source: Store,
  destination: Store,
  existing: ReadonlyMap<string, ObjectInfo>,
  options: CheckOptions,
): Promise<Verdict[]> {
  const verdicts = new Array<Verdict>(objects.length);
  await checkEach(plan, objects, source, destination, existing, options, (i, v) => {
    verdicts[i] = v;
  });
  return verdicts;
}

/** Objects whose verdicts checkEach holds at once. */
const CHECK_SLICE = 4096;

/**
 * checkObjects handing each verdict to `each` with the object's index, a slice at a time, so that memory
 * holds one slice's verdicts and not one per object.
 */
export async function checkEach(
  plan: Pick<PlanHead, "id" | "destination">,
  objects: readonly PlannedObject[],
  source: Store,
  destination: Store,
  existing: ReadonlyMap<string, ObjectInfo>,
  options: CheckOptions,
  each: (index: number, verdict: Verdict) => void,
): Promise<void> {
  const stepDir = plan.destination.stepDir;
  const mine = options.mine;
  // Records are read only for stored objects this process did not write or check itself: none stored yet (a
  // fresh group, even in a step others have filled), or all of them its own (a part it has just written, whose
  // records it wrote before this check), and there is nothing to read.
  const stored = objects.some((o) => existing.has(o.target) && !mine?.has(o.target));
  const records = stored ? await readRecords(destination, stepDir, plan.id, options.part) : new Map<string, Recorded>();
  for (let start = 0; start < objects.length; start += CHECK_SLICE) {
    const slice = objects.slice(start, start + CHECK_SLICE);
    const verdicts = await mapLimited(slice, options.concurrency, (o) =>
      checkObject(
        source,
        destination,
        o,
        joinKey(stepDir, o.target),
        existing.get(o.target),
        records.get(o.target) ?? mine?.get(o.target),
        options,
      ),
    );
    for (const [i, v] of verdicts.entries()) each(start + i, v);
  }
}

/** The verdict on one planned object `o` stored under `key` (see checkObjects). */
async function checkObject(
  source: Store,
  destination: Store,
  o: PlannedObject,
  key: string,
  info: ObjectInfo | undefined,
  record: Recorded | undefined,
  options: CheckOptions,
): Promise<Verdict> {
  if (info === undefined) return { defect: "missing" };
  if (record === undefined) return options.adopt ? adoptCopy(source, destination, o, key, info) : { defect: "unrecorded" };
  if (info.size !== record.size || (o.size !== null && info.size !== o.size)) return { defect: "size" };
  const mine = options.mine?.get(o.target);
  if (info.crc32c === undefined && mine !== undefined && mine.size === info.size && mine.crc32c === record.crc32c) {
    return { done: record, recorded: true };
  }
  const expected = record.crc32c ?? (await sourceCrc(source, o));
  if (expected === undefined) return { defect: "unrecorded" };
  return (await storedCrc(destination, key, info)) === expected ? { done: record, recorded: true } : { defect: "checksum" };
}

/** An unrecorded verbatim copy whose stored bytes match its source (read again to compare) is done. */
async function adoptCopy(source: Store, destination: Store, o: PlannedObject, key: string, info: ObjectInfo): Promise<Verdict> {
  if (o.size !== null && info.size !== o.size) return { defect: "size" };
  const expected = await sourceCrc(source, o);
  if (expected === undefined) return { defect: "unrecorded" };
  return (await storedCrc(destination, key, info)) === expected
    ? { done: { size: info.size, crc32c: expected }, recorded: false }
    : { defect: "checksum" };
}
