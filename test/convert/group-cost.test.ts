// A convert-group's cost follows its own objects: with 256 groups, one group reads the plan's small head
// and its own part, lists only the directories it writes to and reads only its own part's records,
// whatever the other groups hold or have written. (The two destinations' names have the same length: the
// plan's head names its destination.)
import { statSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, expect, test } from "vitest";
import { groupPhase, planPhase } from "../../src/convert/convert.js";
import { DEFAULT_EXECUTE } from "../../src/convert/execute.js";
import type { Plan } from "../../src/convert/plan-format.js";
import { PLAN_KEY, planPartKey, planPartsDir, RECORDS_DIR, recordsDir } from "../../src/convert/work-dir.js";
import { CountingStore } from "../../src/store/counting.js";
import { LocalStore } from "../../src/store/local.js";
import { CONVERT_DEFAULTS, fixtureCase, removeScratch, scratch } from "../helpers/convert.js";

afterAll(removeScratch);

const GROUPS = 256;
const source = fixtureCase("dtypes");

interface Run {
  plan: Plan;
  stepDir: string;
  group: number;
  /** What the group's run read whole (keys relative to the step, the plan id replaced by <id>), and how many bytes. */
  reads: string[];
  bytes: number;
  lists: number;
}

async function planned(label: string): Promise<{ plan: Plan; dest: string; group: number }> {
  const dest = scratch(label);
  const { plan } = await planPhase(source.location, dest, { ...CONVERT_DEFAULTS, groups: GROUPS });
  // The busiest group: the one most likely to share directories with others.
  const size = (g: number) => (plan.groups[g] as { start: number; end: number }).end - (plan.groups[g] as { start: number }).start;
  let group = 0;
  for (let g = 1; g < plan.groups.length; g++) if (size(g) > size(group)) group = g;
  return { plan, dest, group };
}

async function counted(dest: string, plan: Plan, group: number): Promise<Run> {
  const stepDir = plan.destination.stepDir;
  const store = new CountingStore(new LocalStore(dest), { log: true });
  await groupPhase(store, plan.step, group, DEFAULT_EXECUTE);
  const rel = (k: string) => k.slice(stepDir.length + 1).replaceAll(plan.id, "<id>");
  return {
    plan,
    stepDir,
    group,
    reads: store.reads.map(rel),
    bytes: store.reads.reduce((s, k) => s + statSync(join(dest, k)).size, 0),
    lists: store.counts.lists,
  };
}

let alone: Run;
let last: Run;
let again: Run;
let partsBytes = 0;

beforeAll(async () => {
  // The group run first, in an empty step.
  const a = await planned("group-cost-a");
  alone = await counted(a.dest, a.plan, a.group);
  // The same group run last, after every other group wrote its objects and records.
  const b = await planned("group-cost-b");
  for (let g = 0; g < GROUPS; g++) if (g !== b.group) await groupPhase(b.dest, b.plan.step, g, DEFAULT_EXECUTE);
  last = await counted(b.dest, b.plan, b.group);
  // And once more: a resume, which reads the group's records.
  again = await counted(b.dest, b.plan, b.group);
  b.plan.groups.forEach((g, i) => {
    for (let p = 0; p < g.parts; p++) partsBytes += statSync(join(b.dest, b.plan.destination.stepDir, planPartKey(b.plan.id, i, p))).size;
  });
}, 120_000);

test("the plan has 256 groups, of which the chosen one holds only part of the objects", () => {
  expect(alone.plan.groups).toHaveLength(GROUPS);
  const g = alone.plan.groups[alone.group] as { start: number; end: number };
  expect(g.end - g.start).toBeGreaterThan(0);
  expect(g.end - g.start).toBeLessThan(alone.plan.totals.objects);
});

test("a group reads only the plan's head and its own part of the plan", () => {
  expect(alone.plan.groups[alone.group]?.parts).toBe(1);
  const part = planPartKey("<id>", alone.group, 0);
  expect(alone.reads).toEqual([PLAN_KEY, part]);
  expect(last.reads).toEqual([PLAN_KEY, part]);
  expect(alone.bytes).toBeLessThan(partsBytes);
});

test("what a group reads and lists is the same whether the other groups have written or not", () => {
  expect(last.bytes).toBe(alone.bytes);
  expect(last.lists).toBe(alone.lists);
});

test("a resumed group reads only its own part's records", () => {
  const records = again.reads.filter((k) => k.startsWith(`${RECORDS_DIR}/`));
  expect(records.length).toBeGreaterThan(0);
  for (const k of records) expect(k.startsWith(`${recordsDir("<id>", { group: again.group, part: 0 })}/`)).toBe(true);
});

test("a plan on record whose parts were cut short (its writer stopped after the head) is resumed: the parts are written again", async () => {
  const { rmSync, existsSync } = await import("node:fs");
  const dest = scratch("group-cost-cut");
  const first = await planPhase(source.location, dest, { ...CONVERT_DEFAULTS, groups: 4 });
  const parts = join(dest, first.plan.destination.stepDir, planPartsDir(first.plan.id));
  rmSync(parts, { recursive: true });
  const again = await planPhase(source.location, dest, { ...CONVERT_DEFAULTS, groups: 4 });
  expect(again).toMatchObject({ reused: true });
  expect(again.plan.id).toBe(first.plan.id);
  expect(existsSync(join(parts, "commit.json"))).toBe(true);
  for (let g = 0; g < 4; g++) await groupPhase(dest, first.plan.step, g, DEFAULT_EXECUTE);
});
