import { NotFoundError } from "../errors.js";
import { joinKey, type Store } from "../store/store.js";
import type { Plan } from "./plan-format.js";

/** LocalStore's temporary names: `<key>.tmp-<12 hex>`. */
const TEMPORARY = /\.tmp-[0-9a-f]{12}$/;

export interface FinalizeReport {
  objects: number;
  files: number;
  indexWritten: boolean;
}

/** Groups whose objects are not all present with their planned sizes, given the destination listing. */
export function incompleteGroups(plan: Plan, existing: ReadonlyMap<string, number>): { group: number; missing: string[] }[] {
  const out: { group: number; missing: string[] }[] = [];
  plan.groups.forEach((g, group) => {
    const missing: string[] = [];
    for (let i = g.start; i < g.end; i++) {
      const o = plan.objects[i];
      if (o === undefined) continue;
      const size = existing.get(o.target);
      if (size === undefined || (o.size !== null && size !== o.size)) missing.push(o.target);
    }
    if (missing.length > 0) out.push({ group, missing });
  });
  return out;
}

export async function listStep(destination: Store, stepDir: string): Promise<Map<string, number>> {
  const existing = new Map<string, number>();
  for await (const o of destination.list(`${stepDir}/`)) existing.set(o.key.slice(stepDir.length + 1), o.size);
  return existing;
}

/**
 * Commits the regular checkpoint: checks that every planned object exists with its planned size, copies
 * the iterator files, then writes `index` last (AXLearn's commit marker). Nothing is committed if any
 * group is incomplete. Safe to run again.
 */
export async function finalize(plan: Plan, source: Store, destination: Store): Promise<FinalizeReport> {
  const stepDir = plan.destination.stepDir;
  const existing = await listStep(destination, stepDir);
  const incomplete = incompleteGroups(plan, existing);
  if (incomplete.length > 0) {
    const total = incomplete.reduce((s, g) => s + g.missing.length, 0);
    const first = incomplete[0]?.missing[0];
    throw new NotFoundError(
      `${total} planned object(s) missing or of the wrong size in group(s) ${incomplete.map((g) => g.group).join(", ")} (first: ${first}); run convert-group for them, then finalize again`,
      { path: `${destination.url}/${stepDir}` },
    );
  }
  // A writer killed between writing a temporary file and renaming it leaves the temporary file behind.
  for (const key of existing.keys()) if (TEMPORARY.test(key)) await destination.delete(joinKey(stepDir, key));
  let files = 0;
  for (const f of plan.files) {
    if (existing.get(f.target) === f.size) continue;
    await destination.write(joinKey(stepDir, f.target), source.readStream(f.source, 0, f.size));
    files++;
  }
  const indexKey = joinKey(stepDir, "index");
  const current = existing.has("index") ? new TextDecoder().decode(await destination.read(indexKey)) : undefined;
  if (current === plan.index) return { objects: plan.objects.length, files, indexWritten: false };
  // Local stores write to a temporary name and rename; GCS makes a single upload visible at once.
  await destination.write(indexKey, new TextEncoder().encode(plan.index));
  return { objects: plan.objects.length, files, indexWritten: true };
}
