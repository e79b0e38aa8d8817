import { afterEach, beforeEach, describe, expect, test, vi } from "vitest";
import { ConvertProgress, CountProgress, eta, LINE_EVERY_MS, progressMode } from "../../src/cli/progress.js";
import type { PlannedObject } from "../../src/convert/plan-format.js";
import { runCli } from "../helpers/cli.js";
import { fixtureCase, removeScratch, scratch } from "../helpers/convert.js";

const object = (target: string, length: number) =>
  ({ target, transform: "copy", data: { kind: "range", key: "d/f", offset: 0, length } }) as unknown as PlannedObject;

describe("how a command shows progress on stderr", () => {
  test("on a terminal, a bar", () => {
    expect(progressMode({}, true)).toBe("bar");
  });

  test("with --json, JSON lines, terminal or not", () => {
    expect(progressMode({ json: true }, false)).toBe("json");
    expect(progressMode({ json: true }, true)).toBe("json");
  });

  test("with neither a terminal nor --json (a CI log, | tee), a short line now and then", () => {
    expect(progressMode({}, false)).toBe("lines");
  });

  test("with --no-progress, nothing, whatever else", () => {
    expect(progressMode({ progress: false }, true)).toBe("off");
    expect(progressMode({ progress: false, json: true }, false)).toBe("off");
  });
});

describe("progress lines in time", () => {
  beforeEach(() => {
    vi.useFakeTimers();
    vi.setSystemTime(1_000_000);
  });
  afterEach(() => {
    vi.useRealTimers();
  });
  const objects = [object("gda/a/.zarray", 182), object("gda/a/0", 5e8), object("gda/b/.zarray", 182), object("gda/b/0", 5e8)];

  test("a JSON line for the first object at once, then one every 3 s", () => {
    const lines: string[] = [];
    const p = new ConvertProgress(objects, "json", (l) => lines.push(l));
    p.object("gda/a/.zarray", 182);
    vi.setSystemTime(1_001_000);
    p.object("gda/a/0", 5e8);
    expect(lines).toHaveLength(1);
    vi.setSystemTime(1_003_000);
    p.object("gda/b/.zarray", 182);
    expect(lines.map((l) => JSON.parse(l))).toMatchObject([
      { event: "progress", bytes: 182 },
      { bytes: 5e8 + 364, arrays: 1 },
    ]);
  });

  test("a log line says what is done of what, in words, and none for a run shorter than 30 s", () => {
    const lines: string[] = [];
    const p = new ConvertProgress(objects, "lines", (l) => lines.push(l));
    p.object("gda/a/.zarray", 182);
    vi.setSystemTime(1_000_000 + LINE_EVERY_MS - 1);
    p.object("gda/a/0", 5e8);
    expect(lines).toEqual([]);
    vi.setSystemTime(1_000_000 + LINE_EVERY_MS);
    p.object("gda/b/.zarray", 182);
    expect(lines).toEqual(["converting: 476.8 MiB of 953.7 MiB (50%), 1 of 2 arrays, 15.9 MiB/s, ETA 30s"]);
  });

  test("a count's log line: how many of how many", () => {
    const lines: string[] = [];
    const p = new CountProgress("verifying arrays", "lines", (l) => lines.push(l));
    vi.setSystemTime(1_000_000 + LINE_EVERY_MS);
    p.update(120, 300);
    expect(lines).toEqual(["verifying arrays: 120 of 300 (40%), ETA 45s"]);
  });

  test("off prints nothing", () => {
    const lines: string[] = [];
    const p = new ConvertProgress(objects, "off", (l) => lines.push(l));
    const c = new CountProgress("verifying arrays", "off", (l) => lines.push(l));
    for (const t of [0, LINE_EVERY_MS, 2 * LINE_EVERY_MS]) {
      vi.setSystemTime(1_000_000 + t);
      p.object("gda/a/0", 1);
      c.update(1, 2);
    }
    expect(lines).toEqual([]);
  });
});

describe("convert's stderr, not on a terminal", () => {
  const tiny = fixtureCase("tiny");
  afterEach(removeScratch);

  test("without --json, a short run prints nothing there", async () => {
    const r = await runCli(["convert", tiny.location, scratch("plain")]);
    expect(r.code).toBe(0);
    expect(r.stderr).toBe("");
  });

  test("with --json, JSON progress lines", async () => {
    const r = await runCli(["convert", tiny.location, scratch("json"), "--json"]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stderr.split("\n")[0] as string)).toMatchObject({ event: "progress", totalArrays: 15 });
  });

  test("with --json --no-progress, nothing", async () => {
    const r = await runCli(["convert", tiny.location, scratch("quiet"), "--json", "--no-progress"]);
    expect(r.code).toBe(0);
    expect(r.stderr).toBe("");
    expect(JSON.parse(r.stdout)).toMatchObject({ committed: true });
  });
});

test("every command that shows progress takes --no-progress", async () => {
  const { COMMANDS } = await import("../../src/cli/main.js");
  const taking = COMMANDS.filter((c) => c.options.some((u) => (typeof u === "string" ? u : u.name) === "progress")).map((c) => c.name);
  expect(taking).toEqual(["inspect", "convert", "export-hf", "import-hf", "convert-group", "verify"]);
});

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
    const p = new ConvertProgress([object("gda/a/.zarray", 182), object("gda/a/0", 1e9)], "json", (l) => lines.push(l));
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
