// Two conversions into one destination step: whoever's plan is on record holds the step. A second,
// different conversion is refused; --force takes the step over and the previous owner commits nothing.
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { verify } from "../../src/convert/verify.js";
import { runBinAsync, runCli } from "../helpers/cli.js";
import { fixtureCase, removeScratch, scratch, WORK_DIR } from "../helpers/convert.js";
import { filesBelow } from "../helpers/paths.js";

afterAll(removeScratch);

const iterators = fixtureCase("iterators");
const large = fixtureCase("large");
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("convert and convert --params-only racing into one destination", () => {
  const ROUNDS = 8;
  const rounds: { codes: number[]; stderr: string[]; failed: number; detail: unknown[] }[] = [];

  test(`always end with one committed, verified step and one clear refusal (${ROUNDS} rounds)`, async () => {
    for (let i = 0; i < ROUNDS; i++) {
      const dest = scratch(`race-${i}`);
      // Alternate who starts first; both start within the same tick.
      const args = [
        ["convert", iterators.location, dest],
        ["convert", iterators.location, dest, "--params-only"],
      ];
      if (i % 2 === 1) args.reverse();
      const results = await Promise.all(args.map((a) => runBinAsync(a)));
      const v = await verify(iterators.location, join(dest, "step_00000100"));
      rounds.push({
        codes: results.map((r) => r.code),
        stderr: results.map((r) => r.stderr),
        failed: v.failed,
        detail: v.checks.filter((c) => !c.ok),
      });
    }
    for (const r of rounds) {
      expect(r.codes.sort()).toEqual([0, 2]);
      const refusal = r.stderr.find((e) => e.trim() !== "" && !e.startsWith("{")) ?? "";
      expect(refusal.trim().split("\n")).toHaveLength(1);
      expect(refusal).toMatch(/orbax2reg: .*(holds the conversion of plan|already committed .*--force|no longer this conversion's)/);
      expect(r.detail).toEqual([]);
      expect(r.failed).toBe(0);
    }
  }, 120_000);
});

/** Objects under gda/ (temporary files of writes in flight aside). */
function gdaFiles(stepDir: string): string[] {
  return filesBelow(join(stepDir, "gda")).filter((p) => !/\.tmp-[0-9a-f]+$/.test(p));
}

describe("--force while another conversion is writing the step", () => {
  const dest = scratch("takeover");
  const stepDir = join(dest, "step_00000200");
  let first: { code: number | null; stderr: string };
  let forced: Awaited<ReturnType<typeof runCli>>;

  test("the forced conversion commits; the one it replaced stops and commits nothing; verify passes", async () => {
    // The first conversion runs in slices (SIGCONT, a few ms, SIGSTOP) until it has written something.
    const child: ChildProcess = spawn(process.execPath, ["bin/orbax2reg.js", "convert", large.location, dest, "--concurrency", "1"], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    let stderr = "";
    child.stderr?.on("data", (d) => {
      stderr += d;
    });
    const exit = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
    let exited = false;
    void exit.then(() => {
      exited = true;
    });
    while (!exited) {
      await sleep(2);
      child.kill("SIGSTOP");
      if (gdaFiles(stepDir).length >= 4) break;
      child.kill("SIGCONT");
    }
    expect(exited).toBe(false);
    forced = await runCli(["convert", large.location, dest, "--params-only", "--force", "--json"]);
    child.kill("SIGCONT");
    first = { code: await exit, stderr };

    expect(forced.code).toBe(0);
    expect(JSON.parse(forced.stdout)).toMatchObject({ committed: true, resumed: false });
    expect(first.code).toBe(2);
    expect(first.stderr).toMatch(/taken over by plan [0-9a-f]+ \(--force\)|no longer this conversion's/);
    const plan = JSON.parse(readFileSync(join(stepDir, WORK_DIR, "plan.json"), "utf8"));
    expect(plan.options.paramsOnly).toBe(true);
    const r = await verify(large.location, stepDir);
    expect(r.checks.filter((c) => !c.ok)).toEqual([]);
  }, 60_000);
});

describe("a different conversion while one is unfinished", () => {
  test("is refused without --force, naming the plan on record; the unfinished one then resumes and commits", async () => {
    const dest = scratch("unfinished");
    expect((await runCli(["plan", iterators.location, dest])).code).toBe(0);
    const r = await runCli(["convert", iterators.location, dest, "--params-only"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/holds the conversion of plan [0-9a-f]{16} \(another source or other options\).*--force takes it over/);
    expect(existsSync(join(dest, "step_00000100", "index"))).toBe(false);
    const resumed = await runCli(["convert", iterators.location, dest, "--json"]);
    expect(resumed.code).toBe(0);
    expect(JSON.parse(resumed.stdout)).toMatchObject({ resumed: true, committed: true });
  });
});

describe("finalize of a plan that is no longer on record", () => {
  test("refuses (exit 2) and leaves the new owner's step uncommitted", async () => {
    const dest = scratch("stale-finalize");
    expect((await runCli(["plan", iterators.location, dest])).code).toBe(0);
    const stale = readFileSync(join(dest, "step_00000100", WORK_DIR, "plan.json"), "utf8");
    // Another conversion takes the step over (writes its plan, nothing else yet).
    expect((await runCli(["plan", iterators.location, dest, "--params-only", "--force"])).code).toBe(0);
    const { finalize } = await import("../../src/convert/finalize.js");
    const { parsePlan } = await import("../../src/convert/plan-format.js");
    const { openStore } = await import("../../src/store/open.js");
    // Its head is enough: finalize looks whose plan is on record before anything else.
    const plan = parsePlan(stale, "stale plan") as Parameters<typeof finalize>[0];
    const destination = await openStore(dest);
    await expect(finalize(plan, await openStore(plan.source.root), destination)).rejects.toThrow(
      /is no longer this conversion's \(plan [0-9a-f]+\): plan [0-9a-f]+ is on record; nothing was committed/,
    );
    expect(existsSync(join(dest, "step_00000100", "index"))).toBe(false);
  });
});
