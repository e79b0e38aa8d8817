import { describe, expect, test } from "vitest";
import { balance, type Unit } from "../../src/convert/groups.js";

/** An array of chunks named `${name}${i}` with the given sizes. */
const arr = (name: string, ...sizes: number[]) => ({ items: sizes.map((_, i) => `${name}${i}`), sizes });
const loads = (groups: Unit<string>[][]) => groups.map((g) => g.reduce((s, u) => s + u.bytes, 0));
const allItems = (groups: Unit<string>[][]) => groups.flatMap((g) => g.flatMap((u) => u.items));

describe("balance", () => {
  test("always returns n groups", () => {
    expect(balance([arr("a", 1, 2)], 5)).toHaveLength(5);
  });

  test("more groups than objects leaves the extra groups empty", () => {
    const groups = balance([arr("a", 10), arr("b", 10)], 4);
    expect(groups.filter((g) => g.length === 0)).toHaveLength(2);
    expect(allItems(groups).sort()).toEqual(["a0", "b0"]);
  });

  test("no arrays gives n empty groups", () => {
    expect(balance([], 3)).toEqual([[], [], []]);
  });

  test("every item lands in exactly one group", () => {
    const arrays = [arr("a", 5, 5, 5, 5, 5), arr("b", 1), arr("c", 30, 2, 2), arr("d", 0, 0)];
    const items = allItems(balance(arrays, 3));
    expect(items.sort()).toEqual(arrays.flatMap((a) => a.items).sort());
  });

  test("a unit's bytes are the sum of its items' sizes and it names its array", () => {
    const arrays = [arr("a", 3, 4), arr("b", 7, 1, 1)];
    for (const u of balance(arrays, 2).flat()) {
      const a = arrays[u.array] as ReturnType<typeof arr>;
      const sum = u.items.reduce((s, item) => s + (a.sizes[a.items.indexOf(item)] as number), 0);
      expect(u.bytes).toBe(sum);
      expect(u.items.every((item) => a.items.includes(item))).toBe(true);
    }
  });

  test("an array at most a share stays one unit", () => {
    const groups = balance([arr("a", 1, 1, 1), arr("b", 3)], 2);
    expect(groups.flat().map((u) => u.items)).toEqual([["a0", "a1", "a2"], ["b0"]]);
  });

  test("an array larger than a share is cut into runs of consecutive chunks of at most the share", () => {
    // total 12 over 3 groups: share 4.
    const groups = balance([arr("a", 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)], 3);
    const units = groups.flat();
    expect(units.map((u) => u.bytes)).toEqual([4, 4, 4]);
    expect(units.flatMap((u) => u.items)).toEqual(arr("a", ...new Array(12).fill(1)).items);
  });

  test("a chunk larger than the share is a unit of its own", () => {
    const units = balance([arr("a", 1, 100, 1)], 2).flat();
    expect(units.map((u) => u.items).sort()).toEqual([["a0"], ["a1"], ["a2"]]);
  });

  test("largest units go first, each into the lightest group (LPT)", () => {
    // Sizes 5, 4, 3, 3, 3 in two groups (share 9, no cuts): 5->g0, 4->g1, 3->g1, 3->g0, 3->g1.
    const groups = balance([arr("a", 3), arr("b", 5), arr("c", 3), arr("d", 4), arr("e", 3)], 2);
    expect(groups.map((g) => g.map((u) => u.items[0]))).toEqual([
      ["b0", "c0"],
      ["d0", "a0", "e0"],
    ]);
    expect(loads(groups)).toEqual([8, 10]);
  });

  test("equal units keep their input order and ties go to the lowest group", () => {
    const groups = balance([arr("a", 2), arr("b", 2), arr("c", 2), arr("d", 2)], 2);
    expect(groups.map((g) => g.map((u) => u.items[0]))).toEqual([
      ["a0", "c0"],
      ["b0", "d0"],
    ]);
  });

  test("the same input gives the same groups", () => {
    const arrays = [arr("a", 9, 1, 8, 2, 7, 3), arr("b", 5, 5), arr("c", 4), arr("d", 6, 6, 6)];
    expect(balance(arrays, 4)).toEqual(balance(arrays, 4));
  });

  test("loads are balanced within the largest unit", () => {
    const arrays = Array.from({ length: 40 }, (_, i) => arr(`x${i}_`, ((i * 37) % 11) + 1, ((i * 13) % 7) + 1));
    const groups = balance(arrays, 6);
    const l = loads(groups);
    const biggest = Math.max(...groups.flat().map((u) => u.bytes));
    expect(Math.max(...l) - Math.min(...l)).toBeLessThanOrEqual(biggest);
  });

  test("zero-byte items are still assigned", () => {
    expect(allItems(balance([arr("z", 0, 0, 0)], 2)).sort()).toEqual(["z0", "z1", "z2"]);
  });

  test("one group takes everything", () => {
    const groups = balance([arr("a", 1, 2), arr("b", 3)], 1);
    expect(groups).toHaveLength(1);
    expect(allItems(groups).sort()).toEqual(["a0", "a1", "b0"]);
  });
});
