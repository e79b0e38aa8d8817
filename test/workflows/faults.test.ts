import { readFileSync } from "node:fs";
import { describe, expect, test } from "vitest";
import { failureKey } from "../../src/convert/work-dir.js";
import { runBin } from "../helpers/cli.js";
import { fixtureCase } from "../helpers/convert.js";
import { emulatorStorage } from "../helpers/gcs.js";
import { convertWorkflowSuite, PROJECT, runWorkflow } from "./emulator.js";

// workflows/convert.yaml on the Workflows emulator when Google's APIs misbehave: the Cloud Run connector answers
// HTTP 5xx or 4xx, a job execution never finishes, publishing an event fails, an old failure report lies
// around. Cloud Run, GCS and Pub/Sub are played by test/e2e/connector-hook.mjs (real job processes against
// fake-gcs-server; events go to a file); the faults are listed in a file the hook reads on every call.

const tiny = fixtureCase("tiny"); // 15 arrays
const STEP = "runs/exp/step_00000100";
const GROUPS = 3;
const TOPIC = `projects/${PROJECT}/topics/orbax2reg-events`;

const { emulator, file, lines, stage } = convertWorkflowSuite("wf-faults", { groups: GROUPS, eventsTopic: TOPIC });

interface HookCall {
  connector: string;
  at: number;
  phase?: string;
  job?: string;
  group?: string | null;
  destination?: string;
  execution?: string;
  event?: string;
  pid?: number;
  refused?: number;
  types?: string[];
  taskCount?: number;
}

const calls = (destination: string) => lines<HookCall>("hooks.jsonl").filter((c) => c.destination === destination);
const starts = (destination: string, phase: string, group: string | null = null) =>
  calls(destination).filter(
    (c) => c.connector === "googleapis.run.v2.projects.locations.jobs.run" && c.phase === phase && c.group === group,
  );
const published = (destination: string) =>
  lines<{ attributes: Record<string, string>; event: { destination: string; type: string } }>("events.jsonl").filter(
    (m) => m.event.destination === destination,
  );
const publishCalls = (types: string) =>
  lines<HookCall>("hooks.jsonl").filter((c) => c.connector === "googleapis.pubsub.v1.projects.topics.publish" && c.types?.includes(types));

/** A bucket holding the tiny checkpoint, the destination for it, and the faults to inject while converting. */
const setUp = (faults: (destination: string) => unknown[]) => stage("faults", tiny.location, STEP, faults);

const committed = async (bucket: string) =>
  (await emulatorStorage().bucket(bucket).file("runs/exp/regular/step_00000100/index").exists())[0];

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe("convert.yaml when Cloud Run's API fails", () => {
  test("an HTTP 500 from jobs.run keeps its code and is retried; the conversion completes", async () => {
    const { bucket, destination, argument } = await setUp((d) => [{ destination: d, phase: "plan", fault: "http", code: 500, times: 1 }]);
    const run = await runWorkflow(emulator, "convert", argument);
    expect(run.state).toBe("SUCCEEDED");
    expect(starts(destination, "plan").map((c) => c.refused ?? null)).toEqual([500, null]);
    expect(await committed(bucket)).toBe(true);
  });

  test("an HTTP 502 from a group's jobs.run is retried like a 500", async () => {
    const { bucket, destination, argument } = await setUp((d) => [{ destination: d, group: 2, fault: "http", code: 502, times: 2 }]);
    const run = await runWorkflow(emulator, "convert", argument);
    expect(run.state).toBe("SUCCEEDED");
    expect(starts(destination, "convert-group", "2").map((c) => c.refused ?? null)).toEqual([502, 502, null]);
    expect(await committed(bucket)).toBe(true);
  });

  test("an HTTP 400 from jobs.run is not retried, and the error keeps its code and tags", async () => {
    const { bucket, destination, argument } = await setUp((d) => [{ destination: d, phase: "plan", fault: "http", code: 400 }]);
    const run = await runWorkflow(emulator, "convert", argument);
    expect(run.state).toBe("FAILED");
    expect(run.error).toMatchObject({ code: 400, tags: ["HttpError"], message: expect.stringMatching(/^plan could not be started: /) });
    expect(starts(destination, "plan")).toHaveLength(1);
    expect(published(destination).map((m) => m.event.type)).toEqual(["conversion.failed"]);
    expect(await committed(bucket)).toBe(false);
  });
});

describe("convert.yaml when a job execution never finishes", () => {
  test("it is cancelled before the retry starts, so the group never runs twice at once", async () => {
    const { bucket, destination, argument } = await setUp((d) => [{ destination: d, group: 1, fault: "hang", times: 1 }]);
    // Long enough that the groups which do not hang finish within it on a loaded machine.
    const run = await runWorkflow(emulator, "convert", { ...argument, job_timeout: 10 });
    expect(run.state).toBe("SUCCEEDED");
    expect(await committed(bucket)).toBe(true);

    const group1 = calls(destination).filter((c) => c.group === "1");
    const [first, second] = starts(destination, "convert-group", "1");
    expect(second).toBeDefined();
    const cancels = group1.filter((c) => c.connector === "googleapis.run.v2.projects.locations.jobs.executions.cancel");
    expect(cancels.map((c) => c.execution)).toEqual([first?.execution]);
    // The hung execution was stopped (its processes are gone) before the next one was even asked for.
    expect(cancels[0]?.at).toBeLessThan(second?.at as number);
    const hung = group1.find((c) => c.event === "started" && c.execution === first?.execution);
    expect(alive(hung?.pid as number)).toBe(false);
    expect(group1.filter((c) => c.event === "finished" && c.execution === first?.execution)).toEqual([]);
  }, 120_000);

  test("when every try hangs, each is cancelled and the conversion fails with TimeoutError", async () => {
    const { bucket, destination, argument } = await setUp((d) => [{ destination: d, phase: "finalize", fault: "hang" }]);
    const run = await runWorkflow(emulator, "convert", { ...argument, job_timeout: 6 });
    expect(run.state).toBe("FAILED");
    expect(run.error).toMatchObject({
      tags: ["TimeoutError"],
      message: expect.stringMatching(/^finalize did not finish within 6 s; its execution .* was cancelled$/),
    });
    const tries = starts(destination, "finalize");
    expect(tries).toHaveLength(3); // the first and two retries
    const cancelled = calls(destination).filter((c) => c.connector === "googleapis.run.v2.projects.locations.jobs.executions.cancel");
    expect(cancelled.map((c) => c.execution)).toEqual(tries.map((t) => t.execution));
    for (let i = 1; i < tries.length; i++) expect((cancelled[i - 1] as HookCall).at).toBeLessThan((tries[i] as HookCall).at);
    expect(await committed(bucket)).toBe(false);
  }, 150_000);
});

describe("convert.yaml when it cannot watch a job execution", () => {
  test("a poll that fails for good cancels the execution before giving up, so nothing keeps running unwatched", async () => {
    const { bucket, destination, argument } = await setUp((d) => [
      { destination: d, group: 0, fault: "hang", times: 1 },
      { destination: d, group: 0, fault: "poll", code: 403, times: 1 },
    ]);
    const run = await runWorkflow(emulator, "convert", argument);
    expect(run.state).toBe("FAILED");
    expect(run.error).toMatchObject({ tags: ["ConversionFailed"], groups: ["0"] });
    expect(run.error?.message).toMatch(/; group 0 could not be watched: .*error code 403/);
    const [only, ...more] = starts(destination, "convert-group", "0");
    expect(more).toEqual([]); // a 403 is not retried
    const cancels = calls(destination).filter((c) => c.connector === "googleapis.run.v2.projects.locations.jobs.executions.cancel");
    expect(cancels.map((c) => c.execution)).toEqual([only?.execution]);
    const hung = calls(destination).find((c) => c.event === "started" && c.execution === only?.execution);
    expect(alive(hung?.pid as number)).toBe(false);
    expect(await committed(bucket)).toBe(false);
  });
});

describe("convert.yaml's failure reports", () => {
  test("a failure report left by an earlier run never decides: a job that dies without one is retried", async () => {
    const { bucket, destination, argument } = await setUp((d) => [{ destination: d, group: 0, times: 1 }]);
    // An earlier run's report for the same step saying retrying cannot help (and one in the old shared layout).
    const stale = emulatorStorage().bucket(bucket);
    const report = { phase: "convert-group", group: 0, permanent: true, message: "stale: an old run's problem" };
    await stale
      .file(
        `runs/exp/regular/step_00000100/${failureKey("0f8c1a2e-0000-4000-8000-000000000000", { permanent: true, task: 0, taskAttempt: 0 })}`,
      )
      .save(JSON.stringify(report));
    await stale.file("runs/exp/regular/step_00000100/.orbax2reg/failures/group-0.json").save(JSON.stringify(report));

    const run = await runWorkflow(emulator, "convert", argument);
    expect(run.state).toBe("SUCCEEDED");
    expect(starts(destination, "convert-group", "0")).toHaveLength(2);
    expect(await committed(bucket)).toBe(true);
    expect(runBin(["verify", argument.source, `${destination}/step_00000100`]).code).toBe(0);
  });

  test("a job that dies without a report every time is retried twice, then fails naming the group", async () => {
    const { destination, argument } = await setUp((d) => [{ destination: d, group: 2 }]);
    const run = await runWorkflow(emulator, "convert", argument);
    expect(run.state).toBe("FAILED");
    expect(run.error).toMatchObject({ tags: ["ConversionFailed"], groups: ["2"] });
    expect(run.error?.message).toMatch(/1 of 3 groups failed; group 2 failed: .*terminated \(injected\)/);
    expect(starts(destination, "convert-group", "2")).toHaveLength(3);
  });
});

describe("convert.yaml's events", () => {
  test("a conversion.succeeded that cannot be published leaves the execution SUCCEEDED", async () => {
    const { bucket, destination, argument } = await setUp((d) => [
      { destination: d, fault: "publish", type: "conversion.succeeded", code: 500 },
    ]);
    const before = publishCalls("conversion.succeeded").length;
    const run = await runWorkflow(emulator, "convert", argument);
    expect(run.state).toBe("SUCCEEDED");
    expect(run.result).toMatchObject({ step: 100, groups: GROUPS, arrays: 15 });
    expect(await committed(bucket)).toBe(true);
    // The publish was tried (and retried: 500 is transient), then given up on; nothing reached the topic.
    expect(publishCalls("conversion.succeeded").length - before).toBe(4);
    expect(published(destination)).toEqual([]);
    expect(readFileSync(file("workflows.log"), "utf8")).toMatch(
      /conversion\.succeeded not published: HTTP server responded with error code 500/,
    );
  });

  test("a conversion.failed that cannot be published still fails the execution with the conversion's own error", async () => {
    const { destination, argument } = await setUp((d) => [
      { destination: d, group: 1 },
      { destination: d, fault: "publish", type: "conversion.failed", code: 403 },
    ]);
    const run = await runWorkflow(emulator, "convert", argument);
    expect(run.state).toBe("FAILED");
    expect(run.error).toMatchObject({ tags: ["ConversionFailed"], groups: ["1"] });
    expect(run.error?.message).toMatch(/group 1 failed/);
    expect(published(destination)).toEqual([]);
  });
});

describe("convert.yaml's argument, read by the plan job", () => {
  test("a bad optional field fails the plan job once, not retried, with a message naming the field; no group runs", async () => {
    const { bucket, destination, argument } = await setUp(() => []);
    const run = await runWorkflow(emulator, "convert", { ...argument, groups: "many" });
    expect(run.state).toBe("FAILED");
    expect(run.error).toMatchObject({ tags: ["PermanentError"], message: 'plan: groups must be a whole number, got "many"' });
    expect(starts(destination, "plan")).toHaveLength(1);
    expect(starts(destination, "convert-group")).toEqual([]);
    // The plan job never read a step: the event says so rather than guessing one.
    const [failed] = published(destination);
    expect(failed?.event).toMatchObject({ type: "conversion.failed", step: null });
    expect(failed?.attributes).toEqual({ type: "conversion.failed" });
    expect(await committed(bucket)).toBe(false);
  });

  test("a task that fails permanently exits 0, so Cloud Run neither retries it nor fails its execution; the workflow still fails with the report's message", async () => {
    const { destination, argument } = await setUp(() => []);
    const run = await runWorkflow(emulator, "convert", { ...argument, tasks_per_group: 0 });
    expect(run.error).toMatchObject({ tags: ["PermanentError"], message: expect.stringMatching(/^plan: tasks_per_group/) });
    const tasks = calls(destination).filter((c) => c.connector === "task") as (HookCall & { attempt?: number; code?: number })[];
    expect(tasks.map((t) => [t.job, t.attempt, t.code])).toEqual([["plan", 0, 0]]);
    // The plan job's execution, as Cloud Run reports it: succeeded.
    const execution = starts(destination, "plan")[0]?.execution as string;
    const state = JSON.parse(readFileSync(file(`runs/${execution.split("/").at(-1)}.json`), "utf8"));
    expect(state).toMatchObject({ done: true, response: { succeededCount: 1 } });
    expect(state.error).toBeUndefined();
  });

  test("the result and the events take the step, groups and tasks from the plan job's answer", async () => {
    const { destination, argument } = await setUp(() => []);
    const run = await runWorkflow(emulator, "convert", { ...argument, source: `${argument.source}/`, groups: "2", tasks_per_group: 2 });
    expect(run.state).toBe("SUCCEEDED");
    expect(run.result).toMatchObject({ source: argument.source, destination: `${destination}/step_00000100`, step: 100, groups: 2 });
    expect(starts(destination, "convert-group", "0").map((c) => c.taskCount)).toEqual([2]);
    const [succeeded] = published(destination);
    expect(succeeded?.attributes).toEqual({ type: "conversion.succeeded", step: "100" });
  });
});
