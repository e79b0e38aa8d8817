// What convert refuses, what --params-only and --dry-run do, and the plan / convert-group / finalize split.
import { cpSync, existsSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { verify } from "../../src/convert/verify.js";
import { runCli } from "../helpers/cli.js";
import {
  axlearnStructure,
  checkRegular,
  convertWith,
  copyOf,
  digests,
  fileList,
  fixtureCase,
  planOnDisk,
  readIndex,
  removeScratch,
  scratch,
  snapshot,
  WORK_DIR,
  zarrays,
} from "../helpers/convert.js";

afterAll(removeScratch);

const tiny = fixtureCase("tiny");
const large = fixtureCase("large");
const iterators = fixtureCase("iterators");

describe("a destination inside the source", () => {
  const step = copyOf(tiny.location, "inside");
  const root = join(step, "..");
  const before = fileList(root);

  test.each([
    ["a directory inside the source step", join(step, "regular")],
    ["the source's own checkpoint root (the step would be converted onto itself)", root],
  ])("is refused when it is %s: exit 2, and nothing is written", async (_label, dest) => {
    const r = await runCli(["convert", step, dest]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/orbax2reg: the destination step .* overlaps the source step/);
    expect(fileList(root)).toEqual(before);
  });
});

describe("a local step still under Orbax's temporary directory name", () => {
  const root = scratch("orbax-tmp");
  const step = join(root, "step_00000100.orbax-checkpoint-tmp-1234");
  cpSync(tiny.location, step, { recursive: true });
  rmSync(join(step, "commit_success.txt"));

  test("is refused as uncommitted: exit 2, naming the directory, and no index written", async () => {
    const dest = scratch("orbax-tmp-dest");
    const r = await runCli(["convert", step, dest, "--step", "100"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`orbax2reg: ${step}: step is not committed (temporary directory name`);
    expect(fileList(dest)).toEqual([]);
  });

  test("converts with --allow-uncommitted", async () => {
    const dest = scratch("orbax-tmp-forced");
    const r = await runCli(["convert", step, dest, "--step", "100", "--allow-uncommitted"]);
    expect(r.code).toBe(0);
    expect((await verify(step, join(dest, "step_00000100"))).failed).toBe(0);
  });
});

describe("--params-only", () => {
  const dest = scratch("params");
  const stepDir = join(dest, "step_00000100");
  let code: number;

  beforeAll(async () => {
    code = (await runCli(["convert", iterators.location, dest, "--params-only"])).code;
  });

  test("converts the model/ arrays and prng_key, nothing else", () => {
    expect(code).toBe(0);
    const paths = [...zarrays(stepDir).keys()];
    expect(paths).toContain("prng_key");
    expect(paths.filter((p) => p !== "prng_key" && !p.startsWith("model/"))).toEqual([]);
    const expected = Object.keys(JSON.parse(readFileSync(iterators.expected as string, "utf8"))).filter(
      (p) => p === "prng_key" || p.startsWith("model/"),
    );
    expect(paths.sort()).toEqual(expected.sort());
  });

  test("leaves out the iterator files", () => {
    expect(existsSync(join(stepDir, "python_0"))).toBe(false);
  });

  test("filters the index to the same arrays: exactly the model/ and prng_key entries of the source index, same order, same JSON", () => {
    const source = readIndex(iterators.index as string);
    const kept = source.filter(([p]) => p === "step" || p === "prng_key" || p.startsWith("model/"));
    expect(kept.at(-1)?.[0]).toBe("prng_key");
    expect(readIndex(join(stepDir, "index"))).toEqual(kept);
    expect(axlearnStructure(readIndex(join(stepDir, "index")))).toEqual(axlearnStructure(kept));
  });

  test("verify passes on it", async () => {
    const r = await verify(iterators.location, stepDir);
    expect(r.checks.filter((c) => !c.ok)).toEqual([]);
  });

  test("the Python checker finds every kept array bit-exact and the index equal to json.dumps of the filtered source index", () => {
    const s = checkRegular([
      { name: "params", regular: stepDir, source_item: iterators.item, source_index: iterators.index as string, params_only: true },
    ]).get("params");
    expect(s?.problems).toEqual([]);
    expect(s?.arrays_matched).toBe(5);
    expect(s?.index_bytes_equal_json_dumps).toBe(true);
    expect(s?.structure_exact_vs_restored_arrays).toBe(true);
  });
});

describe("--dry-run", () => {
  test("convert --dry-run reports the plan and writes nothing", async () => {
    const dest = join(scratch("dry"), "regular");
    const r = await runCli(["convert", tiny.location, dest, "--dry-run"]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/dry run: would convert step 100: 15 arrays/);
    expect(r.stdout).toMatch(/nothing was written/);
    expect(existsSync(dest)).toBe(false);
  });

  test("plan --dry-run writes no plan", async () => {
    const dest = join(scratch("dry-plan"), "regular");
    const r = await runCli(["plan", tiny.location, dest, "--dry-run", "--groups", "2"]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/would write plan for step 100/);
    expect(existsSync(dest)).toBe(false);
  });
});

describe("--groups 3: plan, convert-group per group, finalize", () => {
  const whole = scratch("whole");
  const dest = scratch("groups");
  const stepDir = join(dest, "step_00000200");
  let plan: ReturnType<typeof planOnDisk>;

  beforeAll(async () => {
    await convertWith(large.location, whole);
    expect((await runCli(["plan", large.location, dest, "--groups", "3"])).code).toBe(0);
    plan = planOnDisk(stepDir);
  }, 60_000);

  test("the plan has 3 non-empty groups whose object ranges partition the plan's objects", () => {
    expect(plan.groups).toHaveLength(3);
    let next = 0;
    for (const g of plan.groups) {
      expect(g.start).toBe(next);
      expect(g.end).toBeGreaterThan(g.start);
      next = g.end;
    }
    expect(next).toBe(plan.objects.length);
    const targets = plan.objects.map((o) => o.target);
    expect(new Set(targets).size).toBe(targets.length);
  });

  test("together the groups plan exactly the gda/ files of a one-group conversion", () => {
    const targets = plan.objects.map((o) => o.target).sort();
    const files = [...snapshot(join(whole, "step_00000200")).keys()].filter((k) => k.startsWith("gda/"));
    expect(targets).toEqual(files);
  });

  test("finalize before every group ran fails with exit 2, names the missing groups, and writes no index", async () => {
    expect((await runCli(["convert-group", dest, "--step", "200", "--group", "1"])).code).toBe(0);
    const r = await runCli(["finalize", dest, "--step", "200"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/missing or of the wrong size in group\(s\) 0, 2/);
    expect(existsSync(join(stepDir, "index"))).toBe(false);
  });

  test("the remaining groups run separately, in any order, and finalize commits the same bytes as one convert", async () => {
    for (const g of ["2", "0"]) expect((await runCli(["convert-group", dest, "--step", "200", "--group", g])).code).toBe(0);
    const r = await runCli(["finalize", dest, "--step", "200"]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^committed /);
    const got = snapshot(stepDir);
    const want = snapshot(join(whole, "step_00000200"));
    expect([...got.keys()]).toEqual([...want.keys()]);
    expect(digests(got)).toEqual(digests(want));
  });

  test("each group left its report in the work directory", () => {
    for (const g of [0, 1, 2]) expect(existsSync(join(stepDir, WORK_DIR, "groups", `${g}.json`))).toBe(true);
  });

  test("a group the plan does not have is a usage error", async () => {
    const r = await runCli(["convert-group", dest, "--step", "200", "--group", "3"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/group 3 does not exist/);
  });
});
