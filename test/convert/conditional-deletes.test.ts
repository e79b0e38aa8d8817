// Every delete of an object that may be written anew names the version it saw (deleteSeen: on GCS
// ifGenerationMatch), so that a retried delete, or one that arrives after someone rewrote the object, never removes
// the newer version: finalize's removal of a replaced conversion's leftovers, --force's take-over and the retreat of
// a writer whose step was taken over. Google counts a delete idempotent, and safe to retry, only with that
// precondition (https://cloud.google.com/storage/docs/retry-strategy).
//
// Run on Google's storage-testbench, which enforces the precondition (fake-gcs-server ignores it on DELETE):
// each test rewrites an object just before the code's delete of it goes out, so an unconditional delete removes the
// new version and fails the test.
import { relative } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { finalize } from "../../src/convert/finalize.js";
import { planOnRecord, readPlan, retreat, takeOver } from "../../src/convert/ownership.js";
import { buildPlan } from "../../src/convert/plan.js";
import type { Plan } from "../../src/convert/plan-format.js";
import { openStep } from "../../src/orbax/step.js";
import { GcsStore } from "../../src/store/gcs.js";
import { LocalStore } from "../../src/store/local.js";
import type { Store } from "../../src/store/store.js";
import { convertWith, removeScratch, scratch } from "../helpers/convert.js";
import { watchDeletes } from "../helpers/deletes.js";
import { filesBelow } from "../helpers/paths.js";
import { newTestbenchBucket, testbenchMissing, testbenchStorage } from "../helpers/testbench.js";

const SOURCE = "test/fixtures/orbax-axlearn/tiny/step_00000100";
const STEP = "step_00000100";
const NEWER = new TextEncoder().encode("written again meanwhile");
const missing = testbenchMissing();

afterAll(removeScratch);

describe.skipIf(missing !== undefined)(`deletes at the version seen, on storage-testbench${missing ? ` (${missing})` : ""}`, () => {
  let bucket = "";
  let stores = 0;
  let converted = "";

  /** A new prefix on the testbench holding the tiny step converted locally (plan, records, index and all). */
  async function convertedStep(): Promise<GcsStore> {
    const store = new GcsStore(bucket, `dest/d${stores++}`, undefined, testbenchStorage());
    for (const file of filesBelow(converted)) {
      const key = relative(converted, file);
      await store.write(key, await new LocalStore(converted).read(key));
    }
    return store;
  }

  const text = async (s: Store, key: string) => new TextDecoder().decode(await s.read(key));

  /** `store`, whose delete of `key` is preceded by a rewrite of it (the newer version a blind delete would remove). */
  function rewrittenBeforeDelete(store: Store, key: string) {
    let done = false;
    return watchDeletes(store, async (k) => {
      if (k !== key || done) return;
      done = true;
      await store.write(key, NEWER);
    });
  }

  beforeAll(async () => {
    bucket = await newTestbenchBucket("deletes");
    converted = scratch("conditional-deletes");
    await convertWith(SOURCE, converted);
  });

  test("finalize's removal of a replaced conversion's leftover spares a version written after the listing", async () => {
    const store = await convertedStep();
    const plan: Plan = await readPlan(store, (await planOnRecord(store, STEP)) as NonNullable<Awaited<ReturnType<typeof planOnRecord>>>);
    const leftover = `${STEP}/gda/replaced/array/0.0`;
    const other = `${STEP}/gda/replaced/array/1.0`;
    await store.write(leftover, new Uint8Array([1]));
    await store.write(other, new Uint8Array([2]));
    const w = rewrittenBeforeDelete(store, leftover);

    const report = await finalize(plan, new LocalStore("test/fixtures/orbax-axlearn/tiny"), w.store);

    expect(report.removed).toBe(2);
    expect(w.plain).toEqual([]);
    expect(w.versioned.map(([k]) => k).sort()).toEqual([leftover, other]);
    expect(await text(store, leftover)).toBe("written again meanwhile");
    expect(await store.stat(other)).toBeUndefined();
  });

  test("--force's take-over spares an object written after its listing, and still uncommits a step committed meanwhile", async () => {
    const store = await convertedStep();
    const source = await openStep(SOURCE);
    const draft = await buildPlan(source, store.url.replace(/\/+$/, ""), { groups: 1, paramsOnly: true });
    const index = `${STEP}/index`;
    const chunk = (await listKeys(store, `${STEP}/gda/`))[0] as string;
    const onIndex = rewrittenBeforeDelete(store, index);
    const w = rewrittenBeforeDelete(onIndex.store, chunk);

    await takeOver(w.store, draft);

    expect(w.plain).toEqual([]);
    // The index: once at the version first seen (refused, it was rewritten), once at the newer one.
    const indexDeletes = w.versioned.filter(([k]) => k === index).map(([, v]) => v);
    expect(indexDeletes).toHaveLength(2);
    expect(new Set(indexDeletes).size).toBe(2);
    expect(await store.stat(index)).toBeUndefined();
    expect(await text(store, chunk)).toBe("written again meanwhile");
    expect((await planOnRecord(store, STEP))?.id).toBe(draft.plan.id);
  });

  test("a writer's retreat after a take-over spares a version written after it looked", async () => {
    const store = await convertedStep();
    const mine = ["gda/mine/array/0.0", "gda/mine/array/1.0"];
    for (const k of mine) await store.write(`${STEP}/${k}`, new Uint8Array([3]));
    const w = rewrittenBeforeDelete(store, `${STEP}/${mine[0]}`);

    await retreat(w.store, STEP, mine);

    expect(w.plain).toEqual([]);
    expect(w.versioned.map(([k]) => k)).toEqual(mine.map((k) => `${STEP}/${k}`));
    expect(await text(store, `${STEP}/${mine[0]}`)).toBe("written again meanwhile");
    expect(await store.stat(`${STEP}/${mine[1]}`)).toBeUndefined();
  });
});

async function listKeys(s: Store, prefix: string): Promise<string[]> {
  const out: string[] = [];
  for await (const o of s.list(prefix)) out.push(o.key);
  return out;
}
