// Retention of converted steps (src/cloud/job/retention.ts): the policy is AXLearn's checkpoint garbage collection
// (apple/axlearn, axlearn/common/checkpointer.py, Checkpointer._run_garbage_collection); the expected lists below
// are what that function deletes for the same committed steps. Then the deletion itself, on a local directory and
// on fake-gcs-server, and through the finalize job.
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeEach, describe, expect, test } from "vitest";
import { runJob } from "../../../jobs/main.js";
import type { ConversionEvent } from "../../../src/cloud/api/events.js";
import { jsonLogger } from "../../../src/cloud/api/log.js";
import {
  type PrunedStep,
  pruneAfterFinalize,
  pruneConverted,
  type RetentionPolicy,
  retentionFromEnv,
  stepsToPrune,
} from "../../../src/cloud/job/retention.js";
import { CLAIM_KEY, PLAN_KEY, recordsDir } from "../../../src/convert/work-dir.js";
import { Orbax2RegError } from "../../../src/errors.js";
import { stepDirName } from "../../../src/orbax/step.js";
import { LocalStore } from "../../../src/store/local.js";
import { openStore } from "../../../src/store/open.js";
import type { Store } from "../../../src/store/store.js";
import { fixtureCase, removeScratch, scratch } from "../../helpers/convert.js";
import { watchDeletes } from "../../helpers/deletes.js";
import { emulatorStorage, newBucket } from "../../helpers/gcs.js";

afterAll(removeScratch);

const policy = (keepLastN: number | null, keepEveryNSteps: number | null): RetentionPolicy => ({ keepLastN, keepEveryNSteps });
const range = (from: number, to: number, by = 1) => Array.from({ length: Math.floor((to - from) / by) + 1 }, (_, i) => from + i * by);

describe("which converted steps the policy deletes (AXLearn's keep_last_n / keep_every_n_steps)", () => {
  test.each([
    ["both rules off keep everything", range(1, 7), policy(null, null), []],
    ["0 is off, like null", range(1, 7), policy(0, 0), []],
    ["keep_last_n=2 keeps the newest two", range(1, 7), policy(2, null), [1, 2, 3, 4, 5]],
    ["keep_last_n=1 keeps the newest only", range(1, 7), policy(1, null), [1, 2, 3, 4, 5, 6]],
    ["keep_last_n=2, keep_every_n_steps=3 over the issue's 7 steps", range(1, 7), policy(2, 3), [2, 3, 5]],
    ["keep_every_n_steps counts step numbers: 100..700 are all 3 apart or more", range(100, 700, 100), policy(2, 3), []],
    ["keep_last_n=2, keep_every_n_steps=300 over 100..700", range(100, 700, 100), policy(2, 300), [200, 300, 500]],
    ["keep_every_n_steps alone keeps no last N", range(1, 7), policy(null, 3), [2, 3, 5, 6]],
    ["keep_last_n larger than the steps keeps them all", range(1, 7), policy(10, null), []],
    ["irregular steps: kept when at least N past the last one kept", [0, 250, 500, 600, 1000, 1100], policy(1, 500), [250, 600]],
    ["order and duplicates of the input do not matter", [7, 3, 1, 5, 2, 6, 4, 4], policy(2, 3), [2, 3, 5]],
    ["no steps, nothing to delete", [], policy(2, 3), []],
  ])("%s", (_label, steps, p, expected) => {
    expect(stepsToPrune(steps, p, Math.max(...steps, 0))).toEqual(expected);
  });

  test("the step just written is never deleted, even when the policy would drop it (converted late)", () => {
    expect(stepsToPrune(range(1, 7), policy(2, null), 3)).toEqual([1, 2, 4, 5]);
  });

  test("the steps kept by keep_last_n do not start the keep_every_n_steps walk", () => {
    // Older steps 10, 11, 12 walk from -inf: 10 kept, 11 and 12 within 5 of it; 13 and 14 are the last two.
    expect(stepsToPrune([10, 11, 12, 13, 14], policy(2, 5), 14)).toEqual([11, 12]);
  });

  test("a negative or fractional setting is refused", () => {
    expect(() => stepsToPrune([1], policy(-1, null), 1)).toThrow(RangeError);
    expect(() => stepsToPrune([1], policy(null, 1.5), 1)).toThrow(RangeError);
  });
});

// ------------------------------------------------------------------------------------------ the destination

const enc = (s: string) => new TextEncoder().encode(s);
const planText = (step: number, id: string) =>
  JSON.stringify({
    format: "orbax2reg-plan",
    version: 2,
    id,
    createdAt: "2026-11-29T18:00:00.000Z",
    source: { root: "gs://train/runs/exp/checkpoints", stepDir: stepDirName(step), layout: "axlearn", fingerprint: "f00d" },
    destination: { root: "gs://train/runs/exp/checkpoints/regular", stepDir: stepDirName(step) },
    step,
  });

/** Keys of a converted step, as a conversion leaves them (index last). */
const convertedKeys = (step: number, committed: boolean): Record<string, string> => {
  const d = stepDirName(step);
  return {
    [`${d}/${PLAN_KEY}`]: planText(step, `plan${step}`),
    [`${d}/${CLAIM_KEY}`]: "{}",
    [`${d}/${recordsDir(`plan${step}`)}/segment-0`]: "[]",
    [`${d}/gda/model/w/.zarray`]: "{}",
    [`${d}/gda/model/w/0.0`]: "x".repeat(100),
    [`${d}/gda/model/w/0.1`]: "y".repeat(100),
    ...(committed ? { [`${d}/index`]: "[]" } : {}),
  };
};

/** The issue's layout: 7 converted steps (1..7, 7 just written), 8 being written (no index), 9 written by AXLearn. */
const LAYOUT: Record<string, string> = {
  ...Object.assign({}, ...range(1, 7).map((s) => convertedKeys(s, true))),
  ...convertedKeys(8, false),
  "step_00000009/index": "[]",
  "step_00000009/gda/model/w/0.0": "z",
  "other/notes.txt": "not a step",
};

async function populate(store: Store): Promise<void> {
  for (const [k, v] of Object.entries(LAYOUT)) await store.write(k, enc(v));
}

/** A store at `location` holding converted (committed) `steps`. */
async function withConverted(location: string, steps: number[]): Promise<Store> {
  const store = await openStore(location);
  for (const s of steps) for (const [k, v] of Object.entries(convertedKeys(s, true))) await store.write(k, enc(v));
  return store;
}

async function keysOf(store: Store): Promise<string[]> {
  const out: string[] = [];
  for await (const o of store.list("")) out.push(o.key);
  return out.sort();
}

const stepsPresent = (keys: string[]) => [...new Set(keys.map((k) => k.split("/")[0]))].sort();

for (const backend of ["a local directory", "GCS (fake-gcs-server)"] as const) {
  describe(`pruning converted steps in ${backend}`, () => {
    let store: Store;
    let lines: Record<string, unknown>[];
    const log = () => jsonLogger({}, (l) => lines.push(JSON.parse(l)));

    beforeEach(async () => {
      lines = [];
      if (backend === "a local directory") store = await openStore(scratch("retention"));
      else store = await openStore(`gs://${await newBucket("retention")}/runs/exp/checkpoints/regular`);
      await populate(store);
    });

    test("keep_last_n=2, keep_every_n_steps=3 deletes steps 2, 3 and 5, index first, each logged and announced", async () => {
      const events: ConversionEvent[] = [];
      const { store: spy, deleted } = watchDeletes(store);
      const pruned = await pruneConverted(spy, 7, policy(2, 3), log(), async (e) => {
        events.push(e);
      });

      expect(pruned.map((p) => p.step)).toEqual([2, 3, 5]);
      const left = await keysOf(store);
      expect(stepsPresent(left)).toEqual(["other", ...[1, 4, 6, 7, 8, 9].map(stepDirName)]);
      if (store instanceof LocalStore) {
        // A local directory keeps empty directories: the pruned steps' are removed too.
        expect(readdirSync(store.root).sort()).toEqual(["other", ...[1, 4, 6, 7, 8, 9].map(stepDirName)]);
      }
      for (const s of [1, 4, 6, 7])
        expect(left.filter((k) => k.startsWith(`${stepDirName(s)}/`))).toEqual(Object.keys(convertedKeys(s, true)).sort());

      // Every deleted key was a key of a pruned step; for each, its index went before anything else of it.
      for (const p of pruned) {
        const mine = deleted.filter((k) => k.startsWith(`${p.stepDir}/`));
        expect(mine[0]).toBe(`${p.stepDir}/index`);
        expect(mine.sort()).toEqual(Object.keys(convertedKeys(p.step, true)).sort());
      }
      expect(deleted.length).toBe(pruned.length * Object.keys(convertedKeys(1, true)).length);

      expect(events.map((e) => [e.type, e.step, e.destination, e.source])).toEqual(
        [2, 3, 5].map((s) => ["conversion.pruned", s, store.url, `gs://train/runs/exp/checkpoints/${stepDirName(s)}`]),
      );
      expect(events[0]?.bytes).toBe(pruned[0]?.bytes);
      expect(pruned[0]?.bytes).toBe(Object.values(convertedKeys(2, true)).reduce((n, v) => n + v.length, 0));
      const perStep = lines.filter((l) => l.message === "pruned a converted step");
      expect(perStep.map((l) => [l.severity, l.step])).toEqual([2, 3, 5].map((s) => ["INFO", s]));
    });

    test("the step being written (a plan, no index) is neither counted nor touched, even while it is written to", async () => {
      const writes: string[] = [];
      const { store: spy, deleted } = watchDeletes(store, async () => {
        // The conversion of step 8 keeps writing while older steps are pruned.
        const key = `${stepDirName(8)}/gda/model/w/1.${writes.length}`;
        writes.push(key);
        await store.write(key, enc("new"));
      });
      await pruneConverted(spy, 7, policy(1, null), log());

      expect(deleted.filter((k) => k.startsWith(`${stepDirName(8)}/`))).toEqual([]);
      const left = await keysOf(store);
      expect(left.filter((k) => k.startsWith(`${stepDirName(8)}/`))).toEqual([...Object.keys(convertedKeys(8, false)), ...writes].sort());
      // keep_last_n=1 counts committed converted steps only: 7 is kept, 8 (uncommitted) and 9 (foreign) are not counted.
      expect(stepsPresent(left)).toEqual(["other", ...[7, 8, 9].map(stepDirName)]);
    });

    test("a step another program wrote (no .orbax2reg/) is neither counted toward keep_last_n nor deleted", async () => {
      const pruned = await pruneConverted(store, 7, policy(2, null), log());
      expect(pruned.map((p) => p.step)).toEqual([1, 2, 3, 4, 5]);
      expect((await keysOf(store)).filter((k) => k.startsWith("step_00000009/"))).toEqual([
        "step_00000009/gda/model/w/0.0",
        "step_00000009/index",
      ]);
    });

    test("both rules off delete nothing and read nothing", async () => {
      const { store: spy, deleted } = watchDeletes(store);
      expect(await pruneConverted(spy, 7, policy(null, null), log())).toEqual([]);
      expect(deleted).toEqual([]);
      expect((await keysOf(store)).length).toBe(Object.keys(LAYOUT).length);
    });

    test("a step taken over (--force) while being pruned keeps what its new owner wrote, uncommitted", async () => {
      const taken = stepDirName(1);
      const { store: spy } = watchDeletes(store, async (key) => {
        if (key === `${taken}/index`) await store.write(`${taken}/${PLAN_KEY}`, enc(planText(1, "forced")));
      });
      const pruned = await pruneConverted(spy, 7, policy(2, null), log());
      expect(pruned.map((p) => p.step)).toEqual([2, 3, 4, 5]);
      const left = (await keysOf(store)).filter((k) => k.startsWith(`${taken}/`));
      expect(left).toContain(`${taken}/${PLAN_KEY}`);
      expect(left).not.toContain(`${taken}/index`);
      expect(lines.some((l) => l.severity === "WARNING" && l.step === 1)).toBe(true);
    });
  });
}

describe("pruning on GCS deletes only the generations it listed", () => {
  // Google counts a delete idempotent, so safe to retry, only with a precondition
  // (https://cloud.google.com/storage/docs/retry-strategy): each one names the generation listed, and a retry after a
  // lost answer, or a delete that comes after someone rewrote the object, cannot remove a newer one. (fake-gcs-server
  // ignores ifGenerationMatch on DELETE, so what is checked here is that every delete asks for it.)
  test("every delete carries ifGenerationMatch with the generation the listing saw, none is unconditional", async () => {
    const store = await withConverted(`gs://${await newBucket("retention")}/regular`, range(1, 3));
    const generations = new Map<string, string | undefined>();
    for await (const o of store.list("")) generations.set(o.key, o.version);
    const { store: watched, plain, versioned: asked } = watchDeletes(store);
    const pruned = await pruneConverted(
      watched,
      3,
      policy(1, null),
      jsonLogger({}, () => {}),
    );
    expect(pruned.map((p) => p.step)).toEqual([1, 2]);
    expect(plain).toEqual([]);
    const mine = [...generations].filter(([k]) => !k.startsWith(`${stepDirName(3)}/`));
    expect(asked.sort()).toEqual(mine.sort());
    expect(asked.every(([, v]) => /^[0-9]+$/.test(v))).toBe(true);
    expect(stepsPresent(await keysOf(store))).toEqual([stepDirName(3)]);
  });
});

describe("pruning on GCS stays inside the destination root", () => {
  test("objects beside the root (a sibling prefix sharing its name's start) are untouched", async () => {
    const bucket = await newBucket("retention");
    const root = await withConverted(`gs://${bucket}/ckpt/regular`, range(1, 3));
    await withConverted(`gs://${bucket}/ckpt/regular-old`, range(1, 3));
    await pruneConverted(
      root,
      3,
      policy(1, null),
      jsonLogger({}, () => {}),
    );
    const [files] = await emulatorStorage().bucket(bucket).getFiles({ prefix: "ckpt/regular-old/" });
    expect(files.length).toBe(3 * Object.keys(convertedKeys(1, true)).length);
    expect(stepsPresent(await keysOf(root))).toEqual([stepDirName(3)]);
  });
});

describe("a pruning failure", () => {
  test("is logged at ERROR and does not fail the finalize step; the other steps are still pruned", async () => {
    const store = await openStore(scratch("retention"));
    await populate(store);
    const { store: failing } = watchDeletes(store, async (key) => {
      if (key.startsWith(`${stepDirName(3)}/gda/`)) throw new Error("403 permission denied (injected)");
    });
    const lines: Record<string, unknown>[] = [];
    const pruned = await pruneAfterFinalize(
      retentionFromEnv({ ORBAX2REG_KEEP_LAST_N: "2" }),
      store.url,
      7,
      jsonLogger({}, (l) => lines.push(JSON.parse(l))),
      { openStore: async () => failing },
    );
    expect(pruned.map((p: PrunedStep) => p.step)).toEqual([1, 2, 4, 5]);
    expect(lines.filter((l) => l.severity === "ERROR").map((l) => l.step)).toEqual([3, 7]);
    expect(String(lines.at(-1)?.message)).toMatch(/pruning failed; step 7 is committed/);
  });
});

describe("the finalize job's retention settings", () => {
  test("unset, empty or 0 keep everything", () => {
    expect(retentionFromEnv({}).policy).toEqual(policy(null, null));
    expect(retentionFromEnv({ ORBAX2REG_KEEP_LAST_N: "", ORBAX2REG_KEEP_EVERY_N_STEPS: "0" }).policy).toEqual(policy(null, null));
  });

  test("are read with the events topic and the execution", () => {
    expect(
      retentionFromEnv({
        ORBAX2REG_KEEP_LAST_N: "2",
        ORBAX2REG_KEEP_EVERY_N_STEPS: "1000",
        ORBAX2REG_EVENTS_TOPIC: "projects/p/topics/orbax2reg-events",
        ORBAX2REG_EXECUTION: "projects/p/locations/r/workflows/w/executions/e",
      }),
    ).toEqual({
      policy: policy(2, 1000),
      eventsTopic: "projects/p/topics/orbax2reg-events",
      execution: "projects/p/locations/r/workflows/w/executions/e",
    });
  });

  test.each([
    ["ORBAX2REG_KEEP_LAST_N", "two"],
    ["ORBAX2REG_KEEP_LAST_N", "-1"],
    ["ORBAX2REG_KEEP_EVERY_N_STEPS", "1.5"],
    ["ORBAX2REG_EVENTS_TOPIC", "orbax2reg-events"],
  ])("%s=%s is a permanent error naming the variable", (name, value) => {
    let error: unknown;
    try {
      retentionFromEnv({ [name]: value });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(Orbax2RegError); // permanent: the job exits 2
    expect(() => retentionFromEnv({ [name]: value })).toThrow(name);
  });
});

describe("the finalize job (runJob) with ORBAX2REG_KEEP_LAST_N", () => {
  const tiny = fixtureCase("tiny");
  let destination: string;
  let lines: Record<string, unknown>[];
  const log = () => jsonLogger({}, (l) => lines.push(JSON.parse(l)));
  const env = (extra: Record<string, string> = {}) => ({
    ORBAX2REG_SOURCE: tiny.location,
    ORBAX2REG_DESTINATION: destination,
    ORBAX2REG_STEP: "100",
    ...extra,
  });
  /** Converted steps 10, 20, 30 from earlier runs, as files. */
  const earlier = [10, 20, 30];

  beforeEach(async () => {
    destination = scratch("retention-job");
    lines = [];
    await withConverted(destination, earlier);
  });

  async function convert(extra: Record<string, string>): Promise<number> {
    expect(await runJob("plan", env(), log())).toBe(0);
    expect(await runJob("convert-group", env({ ORBAX2REG_GROUP: "0" }), log())).toBe(0);
    return runJob("finalize", env(extra), log());
  }

  test("commits the step, then deletes the converted steps beyond the newest two", async () => {
    expect(await convert({ ORBAX2REG_KEEP_LAST_N: "2" })).toBe(0);
    expect(existsSync(join(destination, tiny.stepDir, "index"))).toBe(true);
    // Objects are what a store holds (a local directory keeps the emptied directories; GCS has none).
    expect(stepsPresent(await keysOf(await openStore(destination)))).toEqual([stepDirName(30), tiny.stepDir]);
    expect(lines.filter((l) => l.message === "pruned a converted step").map((l) => l.step)).toEqual([10, 20]);
  });

  test("without a retention variable deletes nothing", async () => {
    expect(await convert({})).toBe(0);
    expect(stepsPresent(await keysOf(await openStore(destination)))).toEqual([...earlier.map(stepDirName), tiny.stepDir].sort());
  });

  test("a bad retention value fails permanently (exit 2) before committing", async () => {
    expect(await convert({ ORBAX2REG_KEEP_LAST_N: "all" })).toBe(2);
    expect(existsSync(join(destination, tiny.stepDir, "index"))).toBe(false);
    expect(stepsPresent(await keysOf(await openStore(destination)))).toEqual([...earlier.map(stepDirName), tiny.stepDir].sort());
    const error = lines.find((l) => l.severity === "ERROR");
    expect(error).toMatchObject({ phase: "finalize", permanent: true });
    expect(String(error?.message)).toContain("ORBAX2REG_KEEP_LAST_N");
  });
});
