import { ChecksumError, ConflictError, NotFoundError } from "../errors.js";
import { describe, joinKey, type Store } from "../store/store.js";
import { checkEach, type Defect, listStep } from "./done.js";
import { assertOwner } from "./ownership.js";
import type { Plan, PlannedObject } from "./plan-format.js";
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

/**
 * Commits the regular checkpoint, only while `plan` is the plan on record: checks that every planned
 * object exists as recorded under this plan (size and CRC-32C), removes what a replaced conversion left
 * under gda/, copies the iterator files, makes every name durable, then writes `index` last (AXLearn's
 * commit marker). Nothing is committed if anything is missing or differs. Safe to run again.
 * `trusted`: objects this process wrote (target -> what it stored), not read back. `beforeCommit` runs
 * right before the index is written and may throw to stop the commit (a cancelled pipeline run).
 */
export async function finalize(
  plan: Plan,
  source: Store,
  destination: Store,
  trusted: Records = new Map(),
  beforeCommit?: () => Promise<void>,
): Promise<FinalizeReport> {
  const stepDir = plan.destination.stepDir;
  const indexKey = joinKey(stepDir, "index");
  await assertOwner(destination, plan);
  const existing = await listStep(destination, stepDir);
  const current = existing.has("index") ? new TextDecoder().decode(await destination.read(indexKey)) : undefined;
  if (current !== undefined && current !== plan.index) {
    throw new ConflictError("the destination step holds an index this plan did not write; --force replaces it", {
      path: describe(destination, indexKey),
    });
  }

  // Local files are read back to compare checksums: a few at once keep the disk busy.
  // The groups' ranges cover plan.objects in order: an object's group follows from its index.
  const bad = new Map<number, { target: string; defect: Defect }[]>();
  let group = 0;
  // Checked a slice at a time. Each planned object is taken out of the listing once checked: what is left
  // under gda/ was written under a plan this one replaced (no set of every planned target is built).
  await checkEach(plan, plan.objects, source, destination, existing, { concurrency: CHECK_CONCURRENCY, mine: trusted }, (i, v) => {
    const o = plan.objects[i] as PlannedObject;
    existing.delete(o.target);
    while (i >= (plan.groups[group]?.end ?? Number.POSITIVE_INFINITY)) group++;
    if (!("defect" in v)) return;
    const list = bad.get(group);
    if (list === undefined) bad.set(group, [{ target: o.target, defect: v.defect }]);
    else list.push({ target: o.target, defect: v.defect }); // in place: a copy per object is quadratic
  });
  if (bad.size > 0) throw incomplete(bad, `${destination.url}/${stepDir}`);

  let removed = 0;
  for (const key of existing.keys()) {
    if (key.startsWith("gda/")) {
      await destination.delete(joinKey(stepDir, key));
      removed++;
    }
  }
  // A writer killed between writing a temporary file and renaming it leaves the temporary file behind.
  await destination.removeAbandoned?.(`${stepDir}/`);
  let files = 0;
  for (const f of plan.files) {
    if (existing.get(f.target)?.size === f.size) continue;
    await destination.write(joinKey(stepDir, f.target), source.readStream(f.source, 0, f.size));
    files++;
  }
  const report = { objects: plan.objects.length, files, removed };
  if (current === plan.index) return { ...report, indexWritten: false };
  // Every object, and its name, must be on disk before the index that commits them; then the index.
  await destination.makeDurable?.(stepDir);
  await beforeCommit?.();
  await assertOwner(destination, plan);
  await destination.write(indexKey, new TextEncoder().encode(plan.index));
  await destination.makeDurable?.(indexKey); // the objects are already: only the index and its name
  return { ...report, indexWritten: true };
}

const WHY: Record<Defect, string> = {
  missing: "missing",
  unrecorded: "not recorded as written under this plan",
  size: "of the wrong size",
  checksum: "different from the CRC-32C of the bytes written",
};

function incomplete(bad: Map<number, { target: string; defect: Defect }[]>, path: string): Error {
  // Checked concurrently: report in group order, and by key within a group.
  const order = [...bad.keys()].sort((a, b) => a - b);
  const all = order.flatMap((g) => (bad.get(g) ?? []).sort((a, b) => (a.target < b.target ? -1 : 1)));
  const groups = order.join(", ");
  const first = all[0] as { target: string; defect: Defect };
  const counts = (Object.keys(WHY) as Defect[])
    .map((d) => [d, all.filter((x) => x.defect === d).length] as const)
    .filter(([, n]) => n > 0)
    .map(([d, n]) => `${n} ${WHY[d]}`)
    .join(", ");
  const message = `${all.length} planned object(s) missing or of the wrong size in group(s) ${groups} (${counts}; first: ${first.target}, ${WHY[first.defect]}); run convert-group for them, then finalize again`;
  return all.every((x) => x.defect === "checksum") ? new ChecksumError(message, { path }) : new NotFoundError(message, { path });
}
