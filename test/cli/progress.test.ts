import { afterEach, beforeEach, describe, expect, test, vi } from "vitest";
import { ConvertProgress, eta } from "../../src/cli/progress.js";
import type { PlannedObject } from "../../src/convert/plan-format.js";

const object = (target: string, length: number) =>
  ({ target, transform: "copy", data: { kind: "range", key: "d/f", offset: 0, length } }) as unknown as PlannedObject;

describe("the progress line's ETA", () => {
  beforeEach(() => {
    vi.useFakeTimers();
    vi.setSystemTime(1_000_000);
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  test("the first line, after a few metadata bytes, says nothing about the ETA", () => {
    const lines: string[] = [];
    const p = new ConvertProgress([object("gda/a/.zarray", 182), object("gda/a/0", 1e9)], false, (l) => lines.push(l));
    vi.setSystemTime(1_000_100);
    p.object("gda/a/.zarray", 182);
    expect(JSON.parse(lines[0] as string)).toMatchObject({ bytes: 182, etaSeconds: null });
  });

  test("there is no ETA until the run is a few seconds old and a share of the bytes is done", () => {
    expect(eta(182, 1e9, 100)).toBeNull();
    expect(eta(5e8, 1e9, 1000)).toBeNull(); // half done, but in one second: one large object, no rate yet
    expect(eta(1e6, 1e9, 60_000)).toBeNull(); // a minute, but 0.1 % of the bytes
  });

  test("then it is the time left at the rate so far", () => {
    expect(eta(2.5e8, 1e9, 10_000)).toBe(30);
    expect(eta(1e9, 1e9, 10_000)).toBe(0);
  });
});
