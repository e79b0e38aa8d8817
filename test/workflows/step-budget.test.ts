import { mkdirSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { stringify } from "yaml";
import { startWorkflows } from "../e2e/emulators.js";
import { fixtureCase, removeScratch, scratch } from "../helpers/convert.js";
import { writeFaults } from "../helpers/faults-file.js";
import { newBucket, uploadDir } from "../helpers/gcs.js";
import type { Running } from "../helpers/servers.js";
import { runWorkflow, startConvertWorkflow } from "./emulator.js";

// An execution may run at most 100,000 steps (https://cloud.google.com/workflows/quotas); past that it fails
// with a ResourceLimitError no except catches, leaving its job executions running and no conversion.failed
// published. The emulator counts steps as Google does (every step entered, each retry attempt, each polling
// attempt of a waiting connector) and fails there too; with --fast-clock its clock runs on through every
// sys.sleep, so a week-long wait costs its real number of polls in seconds. docs/workflows-reference.md,
// "The step budget", derives the worst case of convert.yaml.

const tiny = fixtureCase("tiny");
const STEP = "runs/exp/step_00000100";
const GROUPS = 3;
const WEEK = 604800;

let work: string;
let emulator: Running;
const file = (name: string) => join(work, name);
/** A Workflows expression, as written in a workflow. */
const wf = (code: string) => `\${${code}}`;

/** The steps an execution ran, as the emulator counted them, and the most bytes its variables took. */
async function countsOf(name: string, on: Running = emulator): Promise<{ steps: number; maxBytes: number }> {
  const r = await fetch(`${on.url}/_emulator/steps?execution=${encodeURIComponent(name)}`);
  return (await r.json()) as { steps: number; maxBytes: number };
}
const stepsOf = async (name: string, on: Running = emulator) => (await countsOf(name, on)).steps;

beforeAll(async () => {
  work = scratch("wf-steps");
  mkdirSync(file("workflows"));
  writeFileSync(
    file("workflows/forever.yaml"),
    stringify({
      main: {
        steps: [
          { init: { assign: [{ i: 0 }] } },
          {
            guarded: {
              try: { steps: [{ loop: { assign: [{ i: wf("i + 1") }], next: "loop" } }] },
              except: { as: "e", steps: [{ caught: { return: "caught" } }] },
            },
          },
        ],
      },
    }),
  );
  writeFileSync(
    file("workflows/counted.yaml"),
    stringify({
      main: {
        steps: [
          { init: { assign: [{ n: 0 }] } },
          { each: { for: { value: "v", range: [1, 10], steps: [{ add: { assign: [{ n: wf("n + v") }] } }] } } },
          { done: { return: wf("n") } },
        ],
      },
    }),
  );
  writeFileSync(
    file("workflows/hoarder.yaml"),
    stringify({
      main: {
        steps: [
          { init: { assign: [{ s: "x" }] } },
          {
            guarded: {
              try: {
                steps: [{ grow: { for: { value: "i", range: [1, 20], steps: [{ double: { assign: [{ s: wf("s + s") }] } }] } } }],
              },
              except: { as: "e", steps: [{ caught: { return: "caught" } }] },
            },
          },
        ],
      },
    }),
  );
  writeFileSync(
    file("workflows/retried.yaml"),
    stringify({
      main: {
        steps: [
          {
            flaky: {
              try: { call: "always_fails" },
              retry: { predicate: wf("always"), max_retries: 2, backoff: { initial_delay: 1, max_delay: 1, multiplier: 1 } },
              except: { as: "e", steps: [{ gave_up: { return: "gave up" } }] },
            },
          },
        ],
      },
      always_fails: { steps: [{ fail: { raise: "failed" } }] },
      always: { params: ["e"], steps: [{ answer: { return: wf("true") } }] },
    }),
  );
  emulator = await startWorkflows(
    {
      workflowsDir: file("workflows"),
      hooks: resolve("test/e2e/hooks.yaml"),
      userEnv: {},
      env: {},
    },
    file("tiny.log"),
  );
}, 60_000);

afterAll(async () => {
  await emulator?.stop();
  removeScratch();
});

describe("the emulator's step count", () => {
  test("is one per step entered: two steps around a for loop of 10 one-assign iterations are 13", async () => {
    const run = await runWorkflow(emulator, "counted");
    expect(run).toMatchObject({ state: "SUCCEEDED", result: 55 });
    expect(await stepsOf(run.name)).toBe(13);
  });

  test("counts every retry attempt again, with the retry predicate's steps", async () => {
    const run = await runWorkflow(emulator, "retried");
    expect(run).toMatchObject({ state: "SUCCEEDED", result: "gave up" });
    // flaky, then 3 attempts of (its call + always_fails' raise), 2 predicate runs, the except's return
    expect(await stepsOf(run.name)).toBe(1 + 3 * 2 + 2 + 1);
  });

  test("fails the execution at 100,000 steps with a ResourceLimitError no except catches", async () => {
    const run = await runWorkflow(emulator, "forever", {}, 300_000);
    expect(run.state).toBe("FAILED");
    expect(run.error).toMatchObject({ tags: ["ResourceLimitError"], message: expect.stringMatching(/100000 steps/) });
    expect(await stepsOf(run.name)).toBe(100_000);
  }, 320_000);

  test("fails the execution, beyond the reach of except, when its variables pass 512 KB (a string doubled 20 times: 1 MB)", async () => {
    const run = await runWorkflow(emulator, "hoarder");
    expect(run.state).toBe("FAILED");
    expect(run.error).toMatchObject({ tags: ["ResourceLimitError"], message: expect.stringMatching(/variables exceeded 524288 bytes/) });
    expect((await countsOf(run.name)).maxBytes).toBeGreaterThan(512 * 1024);
  });
});

describe("convert.yaml's step budget", () => {
  let convert: Running;
  beforeAll(async () => {
    convert = await startConvertWorkflow(work, {
      groups: GROUPS,
      // The week passes on the emulator's clock; the hung execution outlasts it in real time.
      env: { E2E_HANG_LIMIT_MS: "600000", E2E_POLL_HOLD_MS: "0" },
      args: ["--fast-clock"],
      log: "convert.log",
    });
  }, 60_000);
  afterAll(async () => {
    await convert?.stop();
  });

  async function convertWith(faults: (destination: string) => unknown[]) {
    const bucket = await newBucket("steps");
    await uploadDir(tiny.location, bucket, STEP);
    const destination = `gs://${bucket}/runs/exp/regular`;
    writeFaults(file("faults.json"), faults(destination));
    const run = await runWorkflow(convert, "convert", { source: `gs://${bucket}/${STEP}`, destination, job_timeout: WEEK }, 600_000);
    return { run, ...(await countsOf(run.name, convert)) };
  }

  test("a group that hangs for a whole week, then is cancelled and retried, costs under 1,100 steps more", async () => {
    const clean = await convertWith(() => []);
    expect(clean.run.state).toBe("SUCCEEDED");
    const slow = await convertWith((d) => [{ destination: d, group: 1, fault: "hang", times: 1 }]);
    expect(slow.run.state).toBe("SUCCEEDED");
    // Its polls back off to every 3 × WEEK × (GROUPS + 1) / 2000 s (about an hour): some 180 polls of five
    // steps over the week, then the cancel, the failure's explanation and the retry.
    const extra = slow.steps - clean.steps;
    console.info(`step count: ${clean.steps} without the hang, ${slow.steps} with a group hung for a week (+${extra})`);
    expect(extra).toBeGreaterThan(5 * 150);
    expect(extra).toBeLessThan(1100);
    expect(slow.steps).toBeLessThan(2000);
    // Its variables stay far below the 512 KB an execution may hold (the largest frame, as JSON).
    console.info(`largest frame: ${clean.maxBytes} bytes without the hang, ${slow.maxBytes} with it`);
    expect(Math.max(clean.maxBytes, slow.maxBytes)).toBeLessThan(64 * 1024);
  }, 900_000);
});
