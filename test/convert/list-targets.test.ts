// What a writer lists of the destination step before it writes and before it commits (done.ts listTargets):
// each listing is a round trip of tens of ms on GCS, and they come before the first object and after the last.
import { describe, expect, test } from "vitest";
import { listTargets } from "../../src/convert/done.js";
import type { PlannedObject } from "../../src/convert/plan-format.js";
import { CountingStore } from "../../src/store/counting.js";
import { LocalStore } from "../../src/store/local.js";
import { tempDir } from "../helpers/tmp.js";

const STEP = "ckpt/step_00000001";

/** One chunk in each of `arrays` array directories, as a plan holds them. */
function planned(arrays: number): PlannedObject[] {
  return Array.from({ length: arrays }, (_, i) => ({
    target: `gda/a${i}/0`,
    data: { kind: "inline", base64: "" },
    transform: "copy",
    size: 0,
  })) as unknown as PlannedObject[];
}

/** A destination step already holding `n` objects, in the directory of array 0 and in one no array of the run writes. */
async function destination(n: number, otherDir = 0): Promise<CountingStore> {
  const store = new LocalStore(tempDir("list-targets"));
  for (let i = 0; i < n; i++) await store.write(`${STEP}/gda/a0/${i}`, new Uint8Array(1));
  for (let i = 0; i < otherDir; i++) await store.write(`${STEP}/gda/elsewhere/${i}`, new Uint8Array(1));
  return new CountingStore(store);
}

describe("listTargets", () => {
  test("a step of few objects is listed whole, in one listing, whatever the number of array directories", async () => {
    const store = await destination(3);
    const existing = await listTargets(store, STEP, planned(50));
    expect(store.counts.lists).toBe(1);
    expect([...existing.keys()].sort()).toEqual(["gda/a0/0", "gda/a0/1", "gda/a0/2"]);
  });

  test("a step of 2,000 objects or more is listed directory by directory, only where the run writes", async () => {
    const store = await destination(5, 1_999);
    const existing = await listTargets(store, STEP, planned(3));
    expect(store.counts.lists).toBe(1 + 3);
    expect(existing.size).toBe(5);
    expect([...existing.keys()].every((k) => k.startsWith("gda/a0/"))).toBe(true);
  });
});
