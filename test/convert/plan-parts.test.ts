// Plan version 4: each group's objects are parts of a fixed object count, written as they fill, with records
// per part; every phase loads, checks and drops one part at a time. Small parts (7 objects) make a small
// fixture many parts.
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { finalizePhase, groupPhase, planPhase } from "../../src/convert/convert.js";
import { DEFAULT_EXECUTE } from "../../src/convert/execute.js";
import { type PlannedObject, parsePart, parsePlan, plannedTargets } from "../../src/convert/plan-format.js";
import { PLAN_KEY, planPartKey, RECORDS_DIR } from "../../src/convert/work-dir.js";
import { runCli } from "../helpers/cli.js";
import { CONVERT_DEFAULTS, convertWith, digests, fixtureCase, planOnDisk, removeScratch, scratch, snapshot } from "../helpers/convert.js";

afterAll(removeScratch);

const source = fixtureCase("dtypes");
const PART = 7;

describe("a plan in 3 groups of parts of 7 objects", () => {
  const dest = scratch("parts");
  let stepDir: string;
  let parts: { group: number; objects: readonly PlannedObject[] }[];

  beforeAll(async () => {
    const { plan } = await planPhase(source.location, dest, { ...CONVERT_DEFAULTS, groups: 3, partObjects: PART });
    stepDir = join(dest, plan.destination.stepDir);
    const head = parsePlan(readFileSync(join(stepDir, PLAN_KEY), "utf8"), PLAN_KEY);
    parts = head.groups.flatMap((g, group) =>
      Array.from({ length: g.parts }, (_, part) => {
        const text = readFileSync(join(stepDir, planPartKey(head.id, group, part)), "utf8");
        return { group, objects: parsePart(head, { group, part }, text, "part").objects };
      }),
    );
  });

  test("each group is ceil(objects / 7) parts, each full but the last", () => {
    const plan = planOnDisk(stepDir);
    for (const [group, g] of plan.groups.entries()) {
      const sizes = parts.filter((p) => p.group === group).map((p) => p.objects.length);
      expect(sizes).toHaveLength(Math.ceil((g.end - g.start) / PART));
      expect(sizes.slice(0, -1).every((n) => n === PART)).toBe(true);
      expect(sizes.reduce((s, n) => s + n, 0)).toBe(g.end - g.start);
    }
    expect(plan.groups.reduce((s, g) => s + g.parts, 0)).toBeGreaterThan(3);
  });

  test("within a part, objects are in data-file order", () => {
    for (const p of parts) {
      const at = p.objects.map((o) => (o.data.kind === "range" ? [o.data.key, o.data.offset] : ["", 0]) as [string, number]);
      const sorted = [...at].sort((a, b) => (a[0] !== b[0] ? (a[0] < b[0] ? -1 : 1) : a[1] - b[1]));
      expect(at).toEqual(sorted);
    }
  });

  test("the parts hold every object of the same plan in one part, once", async () => {
    const whole = scratch("parts-whole");
    await planPhase(source.location, whole, { ...CONVERT_DEFAULTS, groups: 1 });
    const one = planOnDisk(join(whole, "step_00000100"));
    const targets = parts.flatMap((p) => p.objects.map((o) => o.target));
    expect(new Set(targets).size).toBe(targets.length);
    expect(targets.sort()).toEqual(one.objects.map((o) => o.target).sort());
  });
});

test("a conversion in parts of 7 objects writes the files of a conversion in one part, its records kept per part", async () => {
  const small = scratch("parts-small");
  const big = scratch("parts-big");
  const a = await convertWith(source.location, small, { partObjects: PART });
  await convertWith(source.location, big);
  const step = a.plan.destination.stepDir;
  expect(digests(snapshot(join(small, step)))).toEqual(digests(snapshot(join(big, step))));
  const recorded = readdirSync(join(small, step, RECORDS_DIR, a.plan.id, "0")).sort((x, y) => Number(x) - Number(y));
  expect(recorded).toEqual(Array.from({ length: a.plan.groups[0]?.parts ?? 0 }, (_, p) => String(p)));
});

test("three tasks of one group split it across its parts; together they write the group and finalize commits", async () => {
  const dest = scratch("parts-tasks");
  const { plan } = await planPhase(source.location, dest, { ...CONVERT_DEFAULTS, groups: 1, partObjects: PART });
  const reports = [];
  for (let t = 0; t < 3; t++) reports.push(await groupPhase(dest, plan.step, 0, { ...DEFAULT_EXECUTE, taskIndex: t, taskCount: 3 }));
  expect(reports.reduce((s, r) => s + r.objects, 0)).toBe(plan.totals.objects);
  expect(reports.every((r) => r.objects > PART)).toBe(true);
  expect(await finalizePhase(dest, plan.step)).toMatchObject({ indexWritten: true, objects: plan.totals.objects });
});

test("finalize removes what no array of the plan has under gda/ (another array, a chunk outside the grid) and keeps the rest", async () => {
  const dest = scratch("parts-leftovers");
  const { plan } = await convertWith(source.location, dest, { partObjects: PART });
  const stepDir = join(dest, plan.destination.stepDir);
  const array = plan.arrays.find((a) => a.shape.length > 0) as { path: string };
  const leftovers = ["gda/not/planned/0", `gda/${array.path}/999.999`];
  for (const k of leftovers) {
    mkdirSync(join(stepDir, k, ".."), { recursive: true });
    writeFileSync(join(stepDir, k), "x");
  }
  rmSync(join(stepDir, "index"));
  const before = digests(snapshot(stepDir, (rel) => rel.startsWith("gda/") && !leftovers.includes(rel)));
  expect(await finalizePhase(dest, plan.step)).toMatchObject({ removed: 2, indexWritten: true });
  for (const k of leftovers) expect(existsSync(join(stepDir, k))).toBe(false);
  expect(digests(snapshot(stepDir, (rel) => rel.startsWith("gda/")))).toEqual(before);
});

test("plannedTargets tells an array's .zarray and chunks of its grid from anything else", () => {
  const planned = plannedTargets([
    { path: "model/w", shape: [4, 6], chunkShape: [2, 3] },
    { path: "step", shape: [], chunkShape: [] },
  ]);
  expect(["gda/model/w/.zarray", "gda/model/w/0.0", "gda/model/w/1.1", "gda/step/0", "gda/step/.zarray"].every(planned)).toBe(true);
  const others = [
    "gda/model/w/2.0",
    "gda/model/w/0",
    "gda/model/w/0.1.0",
    "gda/model/w/01.0",
    "gda/model/x/0.0",
    "gda/model/0.0",
    "gda/step/1",
  ];
  expect(others.filter(planned)).toEqual([]);
});

test("a step holding a plan of version 3 is refused, naming the older orbax2reg and --force; --force converts it", async () => {
  const dest = scratch("parts-v3");
  const stepDir = join(dest, "step_00000100");
  mkdirSync(join(stepDir, ".orbax2reg"), { recursive: true });
  const head = {
    format: "orbax2reg-plan",
    version: 3,
    id: "00aa",
    source: { root: "/x", stepDir: "", fingerprint: "f" },
    groups: [],
    totals: {},
  };
  writeFileSync(join(stepDir, PLAN_KEY), JSON.stringify(head));
  const refused = await runCli(["convert", source.location, dest]);
  expect(refused.code).toBe(2);
  expect(refused.stderr).toMatch(/plan version 3 is not supported .*older orbax2reg.*--force/);
  const group = await runCli(["convert-group", dest, "--step", "100", "--group", "0"]);
  expect(group.stderr).toMatch(/plan version 3 is not supported .*older orbax2reg.*--force/);
  expect((await runCli(["convert", source.location, dest, "--force"])).code).toBe(0);
});
