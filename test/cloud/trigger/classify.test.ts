import { describe, expect, test } from "vitest";
import { classify, type TriggerConfig } from "../../../src/cloud/trigger/classify.js";

const config: TriggerConfig = { rootPrefixes: ["runs"], destinationTemplate: "gs://{bucket}/{root}/regular" };

describe("which finalized objects start a conversion", () => {
  test("a step's own commit marker converts that step into the destination template", () => {
    expect(classify("train", "runs/exp1/checkpoints/step_00001000/commit_success.txt", config)).toEqual({
      kind: "convert",
      layout: "axlearn",
      step: 1000,
      source: "gs://train/runs/exp1/checkpoints/step_00001000",
      destination: "gs://train/runs/exp1/checkpoints/regular",
      convert: true,
    });
  });

  test.each([
    ["a chunk of the OCDBT store", "runs/exp1/checkpoints/step_00001000/state/d/0123456789abcdef0123456789abcdef"],
    ["the state item's marker", "runs/exp1/checkpoints/step_00001000/state/commit_success.txt"],
    ["the index item's marker", "runs/exp1/checkpoints/step_00001000/index/commit_success.txt"],
    ["the index item itself", "runs/exp1/checkpoints/step_00001000/index/index"],
    ["a temporary step directory", "runs/exp1/checkpoints/step_00001000.orbax-checkpoint-tmp/commit_success.txt"],
    ["a marker outside a step directory", "runs/exp1/checkpoints/commit_success.txt"],
    ["a converted regular checkpoint's index", "runs/exp1/checkpoints/regular/step_00001000/index"],
    ["a step outside the watched roots", "other/exp/step_00001000/commit_success.txt"],
  ])("%s is ignored", (_label, name) => {
    expect(classify("train", name, config).kind).toBe("ignore");
  });

  test("an empty prefix watches the whole bucket", () => {
    expect(classify("b", "step_00000007/commit_success.txt", { ...config, rootPrefixes: [""] })).toMatchObject({
      kind: "convert",
      step: 7,
      source: "gs://b/step_00000007",
      destination: "gs://b/regular",
    });
  });

  test("a watched prefix matches whole path segments only", () => {
    expect(classify("b", "runsX/step_00000001/commit_success.txt", config).kind).toBe("ignore");
  });

  test("the destination template can name the step", () => {
    const c = { ...config, destinationTemplate: "gs://exports/{root}/{step}" };
    expect(classify("train", "runs/a/step_00000005/commit_success.txt", c)).toMatchObject({
      destination: "gs://exports/runs/a/step_00000005",
    });
  });
});

describe("convert_every_n_steps", () => {
  const every = (n: number): TriggerConfig => ({ ...config, convertEveryNSteps: n });

  test("a step divisible by N is converted", () => {
    expect(classify("train", "runs/a/step_00003000/commit_success.txt", every(1000))).toMatchObject({ kind: "convert", step: 3000 });
  });

  test("a step not divisible by N is ignored, saying why", () => {
    expect(classify("train", "runs/a/step_00003500/commit_success.txt", every(1000))).toEqual({
      kind: "ignore",
      reason: "step 3500 is not a multiple of convert_every_n_steps (1000)",
    });
  });

  test("step 0 is divisible by every N", () => {
    expect(classify("train", "runs/a/step_00000000/commit_success.txt", every(7)).kind).toBe("convert");
  });

  test("1, or no setting, converts every step", () => {
    for (const c of [every(1), config]) expect(classify("train", "runs/a/step_00000007/commit_success.txt", c).kind).toBe("convert");
  });

  test("applies to both halves of the emergency layout", () => {
    expect(classify("train", "runs/e/tensors/step_00000150/commit_success.txt", every(100)).kind).toBe("ignore");
    expect(classify("train", "runs/e/non-tensors/step_00000150/index", every(100)).kind).toBe("ignore");
    expect(classify("train", "runs/e/non-tensors/step_00000200/index", every(100)).kind).toBe("convert");
  });
});

describe("AXLearn's emergency layout", () => {
  test("the tensors commit marker converts once the non-tensors index exists too", () => {
    expect(classify("train", "runs/e/tensors/step_00000100/commit_success.txt", config)).toEqual({
      kind: "convert",
      layout: "emergency",
      step: 100,
      source: "gs://train/runs/e/tensors/step_00000100",
      destination: "gs://train/runs/e/regular",
      convert: true,
      requires: { bucket: "train", name: "runs/e/non-tensors/step_00000100/index" },
    });
  });

  test("the non-tensors index converts once the tensors step is committed", () => {
    expect(classify("train", "runs/e/non-tensors/step_00000100/index", config)).toMatchObject({
      kind: "convert",
      source: "gs://train/runs/e/tensors/step_00000100",
      requires: { name: "runs/e/tensors/step_00000100/commit_success.txt" },
    });
  });
});

describe("which steps hf_export exports", () => {
  const exporting: TriggerConfig = {
    ...config,
    convertEveryNSteps: 1000,
    export: { everyNSteps: 5000, steps: [1500], destinationTemplate: "gs://{bucket}/{root}/hf/{step}" },
  };
  const marker = (step: string) => `runs/exp1/checkpoints/${step}/commit_success.txt`;

  test("a step asked for both is converted and exported into the export template's folder", () => {
    expect(classify("train", marker("step_00005000"), exporting)).toMatchObject({
      kind: "convert",
      convert: true,
      exportTo: "gs://train/runs/exp1/checkpoints/hf/step_00005000",
    });
  });

  test("a step asked only for the export is exported without being converted", () => {
    expect(classify("train", marker("step_00001500"), exporting)).toMatchObject({
      kind: "convert",
      convert: false,
      exportTo: expect.any(String),
    });
  });

  test("a step only converted has no export", () => {
    expect(classify("train", marker("step_00002000"), exporting)).not.toHaveProperty("exportTo");
  });

  test("a step asked for neither is ignored, saying so", () => {
    expect(classify("train", marker("step_00002500"), exporting)).toEqual({
      kind: "ignore",
      reason: "step 2500 is not a multiple of convert_every_n_steps (1000) and not a step hf_export asks for",
    });
  });
});

describe("the post-deploy check's own example step", () => {
  const strict: TriggerConfig = {
    ...config,
    convertEveryNSteps: 1000,
    export: { everyNSteps: 100, steps: [100], destinationTemplate: "gs://{bucket}/{root}/hf/{step}" },
  };
  const checkMarker = "runs/orbax2reg-check-0a1b2c3d/step_00000100/commit_success.txt";

  test("is converted whatever convert_every_n_steps says", () => {
    expect(classify("train", checkMarker, strict)).toMatchObject({ kind: "convert", step: 100, convert: true });
  });

  test("is never exported by the hf_export rules", () => {
    expect(classify("train", checkMarker, strict)).not.toHaveProperty("exportTo");
  });

  test("a run's folder that only looks like the check's follows the rules", () => {
    expect(classify("train", "runs/orbax2reg-check-notes/step_00000100/commit_success.txt", strict)).toMatchObject({
      convert: false,
      exportTo: expect.any(String),
    });
  });
});
