import { describe, expect, test } from "vitest";
import { DECODER_BYTES, decoderBytes, exportWindow, memoryPlan } from "../../src/hf/export.js";

const MiB = 2 ** 20;

describe("how export-hf shares --memory between chunk decoders and output bands", () => {
  test("a source with few chunks keeps every decoder open and gives the rest to bands", () => {
    const plan = memoryPlan(8, 336 * MiB, 10 * MiB);
    expect(plan.maxOpen).toBe(8);
    expect(plan.maxBand).toBe(336 * MiB - 8 * DECODER_BYTES);
  });

  test("fuji-7B at fsdp=256 keeps its 86 MiB bfloat16 gate_proj whole and caps the decoders, re-decoding a fifth of the chunks rather than every chunk five more times", () => {
    const gate = 11008 * 4096 * 2;
    const plan = memoryPlan(256, 336 * MiB, gate);
    expect(plan.maxBand).toBeGreaterThanOrEqual(gate);
    expect(plan.maxOpen).toBe(Math.floor((336 * MiB - gate) / DECODER_BYTES));
  });

  test("without stacked tensors the decoders get all but 16 MiB", () => {
    expect(memoryPlan(256, 336 * MiB).maxOpen).toBe(Math.floor((320 * MiB) / DECODER_BYTES));
  });

  test("a tensor larger than the memory is made in as few bands as fit beside at least 8 decoders", () => {
    const plan = memoryPlan(64, 100 * MiB, 300 * MiB);
    expect(plan.maxOpen).toBeGreaterThanOrEqual(8);
    expect(plan.maxBand).toBeGreaterThanOrEqual(75 * MiB);
    expect(plan.maxBand + plan.maxOpen * DECODER_BYTES).toBeLessThanOrEqual(100 * MiB);
  });
});

describe("what one open decoder costs", () => {
  test("reading from gs:// (1 MiB windows, one ahead) counts more per decoder than from a local disk, so fewer stay open in the same --memory", () => {
    const gcs = decoderBytes(exportWindow("gs://bucket/step", 256, 336 * MiB));
    expect(gcs).toBeGreaterThan(decoderBytes(exportWindow("/data/step", 256, 336 * MiB)));
    expect(memoryPlan(256, 336 * MiB, 0, gcs).maxOpen).toBeLessThan(memoryPlan(256, 336 * MiB).maxOpen);
  });
});

describe("how much each read of a chunk takes (each read is a round trip on GCS)", () => {
  test("from gs:// with few decoders open: 4 MiB windows, their decoders within a quarter of --memory", () => {
    expect(exportWindow("gs://bucket/step", 8, 336 * MiB)).toBe(4 * MiB);
    expect(8 * decoderBytes(4 * MiB)).toBeLessThanOrEqual(84 * MiB);
  });

  test("from gs:// the window shrinks as more decoders are open, down to 1 MiB for fuji's fsdp=256 meshes", () => {
    expect(exportWindow("gs://bucket/step", 16, 336 * MiB)).toBe(2 * MiB);
    expect(exportWindow("gs://bucket/step", 256, 336 * MiB)).toBe(MiB);
  });

  test("from a local disk: 256 KiB, however few decoders are open", () => {
    expect(exportWindow("/data/step", 1, 336 * MiB)).toBe(256 * 1024);
  });
});
