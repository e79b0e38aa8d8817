import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { type ExecutionRef, type Executions, rootLabel } from "../../../src/cloud/api/executions.js";
import { backfill } from "../../../src/cloud/ops/backfill.js";
import { stepDirName } from "../../../src/orbax/step.js";
import { localRoot, localRootDeps, ROOT, WORKFLOW } from "../../helpers/checkpoint-root.js";

// backfill over a root with many steps: the Workflows API is listed once for the root (not once per step) and
// the steps are started a few at a time. Local stores stand in for GCS, with claims kept in memory.

const STEPS = 1_000;

describe("cloud backfill over a root with many steps", () => {
  test("lists the root's live executions once and starts the steps a few at a time", async () => {
    const base = localRoot(
      "backfill-scale",
      Array.from({ length: STEPS }, (_, s) => s),
    );
    const started: ExecutionRef[] = [];
    const calls = { find: 0, findFull: 0, get: 0 };
    let inFlight = 0;
    let most = 0;
    const executions: Executions = {
      async start(workflow, argument, labels) {
        most = Math.max(most, ++inFlight);
        await new Promise((r) => setTimeout(r, 1));
        inFlight--;
        const name = `${workflow}/executions/e${started.length}`;
        started.unshift({ name, state: "ACTIVE", startTime: new Date().toISOString(), argument: JSON.stringify(argument), labels });
        return name;
      },
      // A step's own look-ups (label step=N, created since its claim) find nothing; the root's finds none running.
      async find(_w, labels) {
        if (labels.step === undefined) calls.find++;
        return [];
      },
      async findFull() {
        calls.findFull++;
        return [];
      },
      async get(name) {
        calls.get++;
        throw new Error(`5 NOT_FOUND: ${name}`);
      },
      async cancel() {
        throw new Error("not here");
      },
    };
    const entries = await backfill(
      ROOT,
      { every: 1, maxRunning: 10_000, dryRun: false, groups: 4, sleep: async () => {} },
      localRootDeps(base, executions),
    );
    expect(entries.filter((e) => e.action === "started")).toHaveLength(STEPS);
    expect(entries.map((e) => e.step)).toEqual(Array.from({ length: STEPS }, (_, s) => s));
    expect(started).toHaveLength(STEPS);
    // status's one FULL listing, backfill's one count of live executions; no per-step request but the start's own.
    expect(calls).toEqual({ find: 1, findFull: 1, get: 0 });
    expect(most).toBeGreaterThan(1);
    expect(most).toBeLessThanOrEqual(8);
  });
});

describe("cloud backfill --export", () => {
  /** Ten committed steps; step 10's export already has its index. Returns what was started. */
  async function run(exportSteps?: number[], listed: ExecutionRef[] = []) {
    const base = localRoot("backfill-export", [0, 5, 10, 15, 20, 25, 30, 35]);
    mkdirSync(join(base, "runs/exp/hf", stepDirName(10)), { recursive: true });
    writeFileSync(join(base, "runs/exp/hf", stepDirName(10), "model.safetensors.index.json"), "{}");
    const started: { step: number; argument: Record<string, unknown> }[] = [];
    const executions: Executions = {
      async start(workflow, argument) {
        started.push({ step: argument.step as number, argument: argument as unknown as Record<string, unknown> });
        return `${workflow}/executions/e${started.length}`;
      },
      find: async () => listed,
      findFull: async () => listed,
      get: async (name) => {
        throw new Error(`5 NOT_FOUND: ${name}`);
      },
      cancel: async () => {
        throw new Error("not here");
      },
    };
    const entries = await backfill(
      ROOT,
      {
        every: 1,
        maxRunning: 100,
        dryRun: false,
        groups: 4,
        sleep: async () => {},
        export: {
          destinationTemplate: "gs://{bucket}/{root}/hf/{step}",
          everyNSteps: 10,
          ruleSteps: [25],
          settings: { dtype: "bfloat16", max_shard_size: "5GB", tasks: 8 },
          ...(exportSteps === undefined ? {} : { steps: exportSteps }),
        },
      },
      localRootDeps(base, executions),
    );
    return { entries, started };
  }

  test("exports, export only, the committed steps hf_export asks for that have no export", async () => {
    const { entries, started } = await run();
    expect(started.map((s) => s.step).sort((a, b) => a - b)).toEqual([0, 20, 25, 30]);
    expect(started.find((s) => s.step === 20)?.argument).toEqual({
      source: `${ROOT}/step_00000020`,
      destination: `${ROOT}/regular`,
      step: 20,
      groups: 4,
      convert: false,
      export: { destination: `${ROOT}/hf/step_00000020`, dtype: "bfloat16", max_shard_size: "5GB", tasks: 8 },
    });
    expect(entries.find((e) => e.step === 10)).toEqual({ step: 10, action: "skipped", why: "exported" });
    expect(entries.find((e) => e.step === 5)).toEqual({ step: 5, action: "skipped", why: "not a step hf_export asks for" });
  });

  test("a step whose export alone is running is left to it", async () => {
    const live: ExecutionRef = {
      name: `${WORKFLOW}/executions/x1`,
      state: "ACTIVE",
      startTime: new Date().toISOString(),
      argument: JSON.stringify({
        source: `${ROOT}/step_00000020`,
        destination: `${ROOT}/regular`,
        step: 20,
        convert: false,
        export: { destination: `${ROOT}/hf/step_00000020` },
      }),
      labels: { step: "20", source: rootLabel(ROOT) },
    };
    const { entries, started } = await run(undefined, [live]);
    expect(started.map((s) => s.step)).not.toContain(20);
    expect(entries.find((e) => e.step === 20)).toEqual({ step: 20, action: "skipped", why: `exporting (${live.name})` });
  });

  test("with a list of steps: those, and only those", async () => {
    const { entries, started } = await run([5, 10]);
    expect(started.map((s) => s.step)).toEqual([5]);
    expect(entries.find((e) => e.step === 10)).toMatchObject({ action: "skipped", why: "exported" });
    expect(entries.find((e) => e.step === 20)).toMatchObject({ action: "skipped", why: "not a step asked for" });
  });
});
