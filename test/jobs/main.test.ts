import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeEach, describe, expect, test } from "vitest";
import { runJob } from "../../jobs/main.js";
import { type FailureReport, failureKey, type PlanSummary, SUMMARY_KEY } from "../../src/cloud/job-reports.js";
import { jsonLogger } from "../../src/cloud/log.js";
import { fixtureCase, removeScratch, scratch } from "../helpers/convert.js";

// The job entry point the workflow runs, phase by phase, against local directories. What it leaves for
// the workflow (summary.json, failures/*.json) is the contract workflows/convert.yaml reads.

const tiny = fixtureCase("tiny");
const source = tiny.location;

let destination: string;
let lines: Record<string, unknown>[];
const log = () => jsonLogger({}, (l) => lines.push(JSON.parse(l)));
const env = (extra: Record<string, string> = {}) => ({
  ORBAX2REG_SOURCE: source,
  ORBAX2REG_DESTINATION: destination,
  ORBAX2REG_STEP: "100",
  ...extra,
});
const readJson = <T>(key: string): T => JSON.parse(readFileSync(join(destination, tiny.stepDir, key), "utf8")) as T;

beforeEach(() => {
  destination = scratch("job");
  lines = [];
});
afterAll(removeScratch);

describe("the job entry point", () => {
  test("plan leaves a small summary for the workflow to fan out over", async () => {
    expect(await runJob("plan", env({ ORBAX2REG_GROUPS: "2" }), log())).toBe(0);
    const summary = readJson<PlanSummary>(SUMMARY_KEY);
    expect(summary).toMatchObject({ step: 100, stepDir: tiny.stepDir, groups: 2, reused: false, committed: false });
    expect(summary.arrays).toBeGreaterThan(0);
    expect(summary.bytes).toBeGreaterThan(0);
  });

  test("plan, every group and finalize commit the step; a second plan reports it committed", async () => {
    expect(await runJob("plan", env({ ORBAX2REG_GROUPS: "2" }), log())).toBe(0);
    for (const group of ["0", "1"]) expect(await runJob("convert-group", env({ ORBAX2REG_GROUP: group }), log())).toBe(0);
    expect(await runJob("finalize", env(), log())).toBe(0);
    expect(existsSync(join(destination, tiny.stepDir, "index"))).toBe(true);

    expect(await runJob("plan", env({ ORBAX2REG_GROUPS: "2" }), log())).toBe(0);
    expect(readJson<PlanSummary>(SUMMARY_KEY)).toMatchObject({ reused: true, committed: true });
  });

  test("a permanent failure exits 2 and leaves a report naming the problem", async () => {
    expect(await runJob("plan", env(), log())).toBe(0);
    expect(await runJob("convert-group", env({ ORBAX2REG_GROUP: "7" }), log())).toBe(2);
    const report = readJson<FailureReport>(failureKey("convert-group", 7));
    expect(report).toMatchObject({ phase: "convert-group", group: 7, task: 0, permanent: true, errorType: "UsageError" });
    expect(report.message).toMatch(/group 7 does not exist/);
    expect(lines.at(-1)).toMatchObject({ severity: "ERROR", permanent: true });
  });

  test("a phase that succeeds removes its earlier failure report", async () => {
    expect(await runJob("finalize", env(), log())).toBe(2); // no plan yet
    expect(existsSync(join(destination, tiny.stepDir, failureKey("finalize")))).toBe(true);
    expect(await runJob("plan", env(), log())).toBe(0);
    expect(await runJob("convert-group", env({ ORBAX2REG_GROUP: "0" }), log())).toBe(0);
    expect(await runJob("finalize", env(), log())).toBe(0);
    expect(existsSync(join(destination, tiny.stepDir, failureKey("finalize")))).toBe(false);
  });

  test("missing configuration is a permanent error that names the variable", async () => {
    expect(await runJob("convert-group", env(), log())).toBe(2);
    expect(lines.at(-1)?.message).toMatch(/ORBAX2REG_GROUP is required/);
  });

  test("an unknown phase is refused", async () => {
    expect(await runJob("convert", env(), log())).toBe(2);
    expect(lines.at(-1)?.message).toMatch(/unknown phase "convert"/);
  });

  test("log lines are single-line JSON with severity, message and the phase's fields", async () => {
    await runJob("plan", env(), log());
    expect(lines.at(-1)).toMatchObject({ severity: "INFO", message: "plan written", phase: "plan", step: 100 });
  });
});
