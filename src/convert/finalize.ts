import { ChecksumError, ConflictError, NotFoundError } from "../errors.js";
import { deleteSeen, describe, joinKey, type ObjectInfo, readIfPresent, type Store } from "../store/store.js";
import { allInOrder } from "../util/budget.js";
import { checkEach, type Defect, listTargets, WHOLE_STEP_LISTING } from "./done.js";
import { assertOwner, readPart } from "./ownership.js";
import { type PartRef, type Plan, type PlanPart, partRanges, plannedTargets } from "./plan-format.js";
import type { Records } from "./records.js";

export interface FinalizeReport {
  objects: number;
  files: number;
  indexWritten: boolean;
  /** Objects under gda/ that no object of this plan is (a replaced conversion's leftovers), removed. */
  removed: number;
}

/** Objects whose stored bytes are read back at once. */
const CHECK_CONCURRENCY = 8;

export interface FinalizeOptions {
  /**
   * Every part was already checked (checkPart) by the caller, which found these defects: a conversion in one
   * process checks each part right after writing it, trusting what it wrote.
   */
  readonly checked?: Shortfall;
  /** Runs right before the index is written and may throw to stop the commit (a cancelled pipeline run). */
  readonly beforeCommit?: () => Promise<void>;
}

/**
 * Commits the regular checkpoint, only while `plan` is the plan on record: checks, a part at a time, that
 * every planned object exists as recorded under this plan (size and CRC-32C), removes what a replaced
 * conversion left under gda/, copies the iterator files, makes every name durable, then writes `index` last
 * (AXLearn's commit marker). Nothing is committed if anything is missing or differs. Safe to run again.
 * Memory holds one part, and the step's listing only as it streams past.
 */
export async function finalize(plan: Plan, source: Store, destination: Store, options: FinalizeOptions = {}): Promise<FinalizeReport> {
  const stepDir = plan.destination.stepDir;
  const indexKey = joinKey(stepDir, "index");
  // Together: round trips at once, failing as they would one after the other. The step's listing goes with
  // them when the parts are already checked and the step is small (a page or two: a refusal is not held up by
  // a long listing); it only reads, and nothing is removed before the checks below.
  const early = options.checked !== undefined && plan.totals.objects <= WHOLE_STEP_LISTING;
  const [, index, scanned] = await allInOrder([
    assertOwner(destination, plan),
    readIfPresent(destination, indexKey),
    early ? scanStep(plan, destination) : undefined,
  ]);
  const current = index === undefined ? undefined : new TextDecoder().decode(index);
  if (current !== undefined && current !== plan.index) {
    throw new ConflictError("the destination step holds an index this plan did not write; --force replaces it", {
      path: describe(destination, indexKey),
    });
  }

  let shortfall = options.checked;
  if (shortfall === undefined) {
    shortfall = new Shortfall();
    for (const [group, g] of plan.groups.entries()) {
      for (let part = 0; part < g.parts; part++) {
        await checkPart(await readPart(destination, plan, { group, part }), source, destination, new Map(), shortfall);
      }
    }
  }
  if (shortfall.count > 0) throw shortfall.error(`${destination.url}/${stepDir}`);

  const { present, leftovers } = scanned ?? (await scanStep(plan, destination));
  // Each at the version listed (deleteSeen): a retried delete, or one after the object was written anew, never
  // removes a newer version.
  for (const o of leftovers) await deleteSeen(destination, o);
  // A writer killed between writing a temporary file and renaming it leaves the temporary file behind.
  await destination.removeAbandoned?.(`${stepDir}/`);
  let files = 0;
  for (const f of plan.files) {
    if (present.get(f.target) === f.size) continue;
    await destination.write(joinKey(stepDir, f.target), source.readStream(f.source, 0, f.size));
    files++;
  }
  const report = { objects: plan.totals.objects, files, removed: leftovers.length };
  if (current === plan.index) return { ...report, indexWritten: false };
  // Every object, and its name, must be on disk before the index that commits them; then the index.
  await destination.makeDurable?.(stepDir);
  await options.beforeCommit?.();
  await assertOwner(destination, plan);
  await destination.write(indexKey, new TextEncoder().encode(plan.index));
  await destination.makeDurable?.(indexKey); // the objects are already: only the index and its name
  return { ...report, indexWritten: true };
}

/**
 * One streaming pass over the step: what is under gda/ and planned by no array of this plan was written under
 * a plan this one replaced (told apart by the arrays' grids, not by a set of every planned target); and the
 * sizes of the plan's files present.
 */
async function scanStep(plan: Plan, destination: Store): Promise<{ present: Map<string, number>; leftovers: ObjectInfo[] }> {
  const stepDir = plan.destination.stepDir;
  const planned = plannedTargets(plan.arrays);
  const fileTargets = new Set(plan.files.map((f) => f.target));
  const present = new Map<string, number>();
  const leftovers: ObjectInfo[] = [];
  for await (const o of destination.list(`${stepDir}/`)) {
    const key = o.key.slice(stepDir.length + 1);
    if (key.startsWith("gda/")) {
      if (!planned(key)) leftovers.push(o);
    } else if (fileTargets.has(key)) present.set(key, o.size);
  }
  return { present, leftovers };
}

/**
 * Checks one part of the plan against what is stored (listTargets: the step whole when small, else only the
 * directories its objects are in; `listed` when the caller has made that listing) and adds what is not done to
 * `shortfall`. `mine`: objects this process wrote or checked (not read back, nor their records).
 */
export async function checkPart(
  part: PlanPart,
  source: Store,
  destination: Store,
  mine: Records,
  shortfall: Shortfall,
  listed?: ReadonlyMap<string, ObjectInfo>,
): Promise<void> {
  const stepDir = part.destination.stepDir;
  const existing = listed ?? (await listTargets(destination, stepDir, part.objects));
  const ref: PartRef = { group: part.group, part: part.part };
  await checkEach(part, part.objects, source, destination, existing, { concurrency: CHECK_CONCURRENCY, mine, part: ref }, (i, v) => {
    if ("defect" in v) shortfall.add(part.group, (part.objects[i] as { target: string }).target, v.defect);
  });
}

const WHY: Record<Defect, string> = {
  missing: "missing",
  unrecorded: "not recorded as written under this plan",
  size: "of the wrong size",
  checksum: "different from the CRC-32C of the bytes written",
};

/**
 * What finalize found not done, summed up as it is found: counts by defect, the groups, and the first object
 * (in group order, then by key). A step with every object missing holds no list of them.
 */
export class Shortfall {
  count = 0;
  private readonly counts = new Map<Defect, number>();
  private readonly groups = new Set<number>();
  private first: { group: number; target: string; defect: Defect } | undefined;

  add(group: number, target: string, defect: Defect): void {
    this.count++;
    this.counts.set(defect, (this.counts.get(defect) ?? 0) + 1);
    this.groups.add(group);
    const f = this.first;
    if (f === undefined || group < f.group || (group === f.group && target < f.target)) this.first = { group, target, defect };
  }

  error(path: string): Error {
    const first = this.first as { target: string; defect: Defect };
    const groups = [...this.groups].sort((a, b) => a - b).join(", ");
    const counts = (Object.keys(WHY) as Defect[])
      .filter((d) => (this.counts.get(d) ?? 0) > 0)
      .map((d) => `${this.counts.get(d)} ${WHY[d]}`)
      .join(", ");
    const message = `${this.count} planned object(s) missing or of the wrong size in group(s) ${groups} (${counts}; first: ${first.target}, ${WHY[first.defect]}); run convert-group for them, then finalize again`;
    return this.counts.get("checksum") === this.count ? new ChecksumError(message, { path }) : new NotFoundError(message, { path });
  }
}

/** The parts of `plan` in order: group after group. */
export function* partsOf(plan: Pick<Plan, "groups" | "partObjects">): Iterable<PartRef> {
  for (let group = 0; group < plan.groups.length; group++) for (const r of partRanges(plan, group)) yield { group, part: r.part };
}
