import { describe, expect, it } from "vitest";
import { growthToFloor } from "../../src/util/heap.js";

const MiB = 2 ** 20;

describe("growthToFloor", () => {
  it("grows a small heap's next limit to the floor", () => {
    const percent = growthToFloor(10 * MiB, 64 * MiB);
    expect(10 * MiB * (1 + percent / 100)).toBeGreaterThanOrEqual(64 * MiB);
    expect(10 * MiB * (1 + (percent - 1) / 100)).toBeLessThan(64 * MiB);
  });

  it("leaves a heap at half the floor or above to V8's own growth", () => {
    expect(growthToFloor(32 * MiB, 64 * MiB)).toBe(0);
    expect(growthToFloor(500 * MiB, 64 * MiB)).toBe(0);
  });

  it("caps the growth of an almost empty heap", () => {
    expect(growthToFloor(0, 64 * MiB)).toBe(1000);
  });
});
