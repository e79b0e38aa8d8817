// The parts executeObjects is made of: range coalescing, the stores' direct-copy capability (local to local
// only, never through a wrapper), and renamesAtomically, the property behind Orbax's commit by rename.
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { coalesce } from "../../src/convert/coalesce.js";
import { planPhase } from "../../src/convert/convert.js";
import { DEFAULT_EXECUTE, executeObjects } from "../../src/convert/execute.js";
import { PLAN_FORMAT, PLAN_VERSION, type PlannedObject } from "../../src/convert/plan-format.js";
import type { Recorded } from "../../src/convert/records.js";
import { PLAN_KEY, WORK_DIR } from "../../src/convert/work-dir.js";
import { CountingStore } from "../../src/store/counting.js";
import { GcsStore } from "../../src/store/gcs.js";
import { LocalStore } from "../../src/store/local.js";
import type { Store, WriteOptions } from "../../src/store/store.js";
import { planOnDisk } from "../helpers/convert.js";
import { FIXTURES } from "../helpers/paths.js";
import { tempDir } from "../helpers/tmp.js";

const copyAt = (target: string, key: string, offset: number, length: number): PlannedObject => ({
  target,
  data: { kind: "range", key, offset, length },
  transform: "copy",
  size: length,
});

describe("coalesce", () => {
  test("batches consecutive small copies of nearby ranges of one file, and nothing else", () => {
    const objects: PlannedObject[] = [
      copyAt("a", "d/0", 0, 100),
      copyAt("b", "d/0", 200, 100),
      copyAt("c", "d/0", 300 + (1 << 20), 100), // too far from b
      copyAt("d", "d/1", 0, 100), // another file
      copyAt("e", "d/1", 100, 100),
      copyAt("big", "d/1", 200, 4 << 20), // too large to coalesce
      { target: "t", data: { kind: "range", key: "d/1", offset: 0, length: 10 }, transform: "transcode", array: 0, size: null },
    ];
    const shape = [...coalesce(objects)].map((x) => ("objects" in x ? { batch: x.objects.map((o) => o.target), span: x.span } : x.target));
    expect(shape).toEqual([{ batch: ["a", "b"], span: 300 }, "c", { batch: ["d", "e"], span: 200 }, "big", "t"]);
  });
});

describe("direct copies (Store.rangeCopyTo)", () => {
  test("a local directory has one into another local directory only; wrappers and GCS have none", () => {
    const local = new LocalStore(tempDir("cap"));
    expect(local.rangeCopyTo(new LocalStore(tempDir("cap")))).toBeTypeOf("function");
    expect(local.rangeCopyTo(new CountingStore(local))).toBeUndefined();
    const wrapped: Store = new CountingStore(local);
    expect(wrapped.rangeCopyTo).toBeUndefined();
    expect("rangeCopyTo" in GcsStore.prototype).toBe(false);
  });

  test("renamesAtomically: a local directory does, a wrapper says what it wraps, GCS does not", () => {
    const local = new LocalStore(tempDir("cap"));
    expect(local.renamesAtomically).toBe(true);
    expect(new CountingStore(local).renamesAtomically).toBe(true);
    expect(Object.hasOwn(GcsStore.prototype, "renamesAtomically")).toBe(false);
  });

  test("executeObjects copies local to local directly (no CRC-32C recorded), and streams through a wrapper", async () => {
    const location = `${FIXTURES}/orbax-axlearn/tiny/step_00000100`;
    const options = { groups: 1, paramsOnly: false, allowUncommitted: false, force: false, dryRun: false };
    const run = async (wrap: boolean) => {
      const root = tempDir("direct");
      await planPhase(location, root, options);
      const plan = planOnDisk(join(root, "step_00000100"));
      const o = plan.objects.find((x) => x.transform === "copy" && x.data.kind === "range") as PlannedObject;
      const d = o.data as Extract<PlannedObject["data"], { kind: "range" }>;
      const source = new CountingStore(new LocalStore(plan.source.root));
      const trusted = new Map<string, Recorded>();
      const report = await executeObjects(plan, [o], wrap ? source : source.inner, new LocalStore(root), {
        ...DEFAULT_EXECUTE,
        trusted,
        part: { group: 0, part: 0 },
      });
      expect(report).toMatchObject({ objects: 1, written: 1, skipped: 0, bytesWritten: d.length });
      const stored = readFileSync(join(root, plan.destination.stepDir, o.target));
      expect(stored).toEqual(readFileSync(join(plan.source.root, d.key)).subarray(d.offset, d.offset + d.length));
      return { recorded: trusted.get(o.target), reads: source.counts.rangeReads };
    };
    const direct = await run(false);
    expect(direct.recorded).toEqual({ size: expect.any(Number) });
    expect(direct.reads).toBe(0);
    const wrapped = await run(true);
    expect(wrapped.recorded).toEqual({ size: direct.recorded?.size, crc32c: expect.any(Number) });
    expect(wrapped.reads).toBe(1);
  });

  test("the writes of one batch of thousands of small copies are bounded (to GCS each is a connection)", async () => {
    const root = tempDir("batch-writes");
    mkdirSync(join(root, "src/d"), { recursive: true });
    writeFileSync(join(root, "src/d/0"), Buffer.alloc(3000 * 100, 7));
    const objects = Array.from({ length: 3000 }, (_, i) => copyAt(`gda/a/${i}`, "d/0", i * 100, 100));
    expect([...coalesce(objects)]).toHaveLength(1);
    let inFlight = 0;
    let most = 0;
    class Slow extends CountingStore {
      override async write(key: string, data: Uint8Array | AsyncIterable<Uint8Array>, options?: WriteOptions) {
        most = Math.max(most, ++inFlight);
        await new Promise((r) => setTimeout(r, 1));
        return super.write(key, data, options).finally(() => inFlight--);
      }
    }
    const plan = {
      id: "ab",
      source: { root: join(root, "src"), stepDir: "", layout: "ocdbt", fingerprint: "" },
      destination: { root: join(root, "dst"), stepDir: "step_00000001" },
      arrays: [],
    };
    // The plan on record: a writer checks that it still owns the step.
    mkdirSync(join(root, "dst/step_00000001", WORK_DIR), { recursive: true });
    const head = { format: PLAN_FORMAT, version: PLAN_VERSION, ...plan, groups: [], partObjects: 1024, totals: {} };
    writeFileSync(join(root, "dst/step_00000001", PLAN_KEY), JSON.stringify(head));
    const options = { ...DEFAULT_EXECUTE, concurrency: 4, part: { group: 0, part: 0 } };
    const report = await executeObjects(
      plan,
      objects,
      new LocalStore(plan.source.root),
      new Slow(new LocalStore(plan.destination.root)),
      options,
    );
    expect(report.written).toBe(3000);
    expect(most).toBeGreaterThan(1);
    expect(most).toBeLessThanOrEqual(4 * 8 + 1); // + the record segment written meanwhile
  });
});
