// `orbax2reg cloud check`'s filter stage (src/cloud/ops/check-filter.ts) asks the real Workflows API whether it applies
// the executions.list filter the trigger relies on (labels and createTime). Whether Google's API does can only be seen
// against it, at check time; what is tested here is that the proof tells an API that applies the filter from ones that
// do not. The APIs are in-memory stand-ins of the Executions interface (src/cloud/api/executions.ts), each misreading
// the filter in one way; a stand-in, because the point is a misbehaving API, which no emulator plays.
import { describe, expect, test } from "vitest";
import type { ExecutionRef, Executions, FindOptions } from "../../../src/cloud/api/executions.js";
import { proveLabelFilter } from "../../../src/cloud/ops/check-filter.js";

const WORKFLOW = "projects/p/locations/us-central1/workflows/orbax2reg-convert";
const LABELS = { step: "100", source: "0123456789abcdef" };
const T0 = Date.parse("2026-12-02T12:00:00Z");

/** The check's execution, another step's, and another root's same step. */
const ALL: (ExecutionRef & { createTime: number })[] = [
  { name: `${WORKFLOW}/executions/mine`, state: "ACTIVE", argument: "{}", labels: LABELS, createTime: T0 },
  { name: `${WORKFLOW}/executions/other-step`, state: "SUCCEEDED", argument: "{}", labels: { ...LABELS, step: "200" }, createTime: T0 - 1 },
  {
    name: `${WORKFLOW}/executions/other-root`,
    state: "SUCCEEDED",
    argument: "{}",
    labels: { ...LABELS, source: "fedcba9876543210" },
    createTime: T0 - 2,
  },
];

/** An Executions whose find applies the label terms and the createTime term only as told. */
function api(applies: { labels: boolean; createTime: boolean }): Executions {
  const find = async (_w: string, labels: Record<string, string>, options: FindOptions = {}) =>
    ALL.filter((e) => !applies.labels || Object.entries(labels).every(([k, v]) => e.labels[k] === v)).filter(
      (e) => !applies.createTime || options.createdSince === undefined || e.createTime >= Date.parse(options.createdSince),
    );
  return {
    start: async () => "",
    find,
    findFull: find,
    get: async () => ALL[0] as ExecutionRef,
    cancel: async () => ALL[0] as ExecutionRef,
  };
}

const prove = (executions: Executions) =>
  proveLabelFilter(executions, WORKFLOW, LABELS, `${WORKFLOW}/executions/mine`, {
    before: new Date(T0 - 300_000).toISOString(),
    after: new Date(T0 + 600_000).toISOString(),
  });

describe("cloud check's proof of the executions filter", () => {
  test("passes against an API that applies the labels and createTime terms, and says what it saw", async () => {
    expect(await prove(api({ labels: true, createTime: true }))).toBe(
      'labels.step="100" AND labels.source="0123456789abcdef" returned 1 execution(s), all with those labels, mine among them; ' +
        "a label value no execution has matched none; createTime>= before it kept it, after it dropped it",
    );
  });

  test("fails, naming the stray execution, against an API that ignores the label terms", async () => {
    await expect(prove(api({ labels: false, createTime: true }))).rejects.toThrow(
      /also returned 2 execution\(s\) without those labels \(e\.g\. .*other-step.*\): the API did not apply the filter/,
    );
  });

  test("fails against an API that ignores the createTime term", async () => {
    await expect(prove(api({ labels: true, createTime: false }))).rejects.toThrow(/the createTime term was not applied/);
  });

  test("fails when the filter no longer finds the execution it found", async () => {
    const lost: Executions = { ...api({ labels: true, createTime: true }), findFull: async () => [] };
    await expect(prove(lost)).rejects.toThrow(/did not return .*mine, the execution it found a moment ago/);
  });
});
