import { describe, expect, test } from "vitest";
import { planIdentityOnRecord } from "../../src/convert/ownership.js";
import { MAX_PLAN_HEAD_BYTES, planIdentity } from "../../src/convert/plan-format.js";
import { PLAN_KEY } from "../../src/convert/work-dir.js";
import { CountingStore } from "../../src/store/counting.js";
import { LocalStore } from "../../src/store/local.js";
import { tempDir } from "../helpers/tmp.js";

// What ownership checks and retention read of the plan on record: its id and source, parsed, not matched.

const source = { root: "gs://train/ckpt", stepDir: "step_00000100", layout: "axlearn", fingerprint: "f00d" };
const enc = (v: unknown) => new TextEncoder().encode(typeof v === "string" ? v : JSON.stringify(v));

describe("planIdentity", () => {
  test("reads the id and source whatever the order of the head's fields", () => {
    const head = { totals: {}, groups: [], source, id: "ab12", format: "orbax2reg-plan", version: 3 };
    expect(planIdentity(JSON.stringify(head))).toEqual({ id: "ab12", source: { root: source.root, stepDir: source.stepDir } });
  });

  test("reads any plan version: it only compares and reports", () => {
    expect(planIdentity(JSON.stringify({ format: "orbax2reg-plan", version: 2, id: "old", source })).id).toBe("old");
  });

  test("says nothing of a field that is missing or not a string, nor of text that is not JSON", () => {
    expect(planIdentity(JSON.stringify({ id: 7, source: { root: 1 } }))).toEqual({ id: undefined, source: undefined });
    expect(planIdentity(JSON.stringify({ id: "x", source: { root: "gs://r" } }))).toEqual({
      id: "x",
      source: { root: "gs://r", stepDir: undefined },
    });
    expect(planIdentity('{"id":"ab12","source":')).toEqual({ id: undefined, source: undefined });
    expect(planIdentity("null")).toEqual({ id: undefined, source: undefined });
  });
});

describe("planIdentityOnRecord", () => {
  test("is undefined for a step with no plan", async () => {
    expect(await planIdentityOnRecord(new LocalStore(tempDir("identity-none")), "step_00000100")).toBeUndefined();
  });

  test("reads the head on record", async () => {
    const store = new LocalStore(tempDir("identity-head"));
    await store.write(`step_00000100/${PLAN_KEY}`, enc({ id: "ab12", source }));
    expect((await planIdentityOnRecord(store, "step_00000100"))?.id).toBe("ab12");
  });

  test("is one request: no stat before the read (a writer looks every 500 ms, and object starts wait for it)", async () => {
    const store = new CountingStore(new LocalStore(tempDir("identity-one")));
    await store.write(`step_00000100/${PLAN_KEY}`, enc({ id: "ab12", source }));
    const before = { ...store.counts };
    expect((await planIdentityOnRecord(store, "step_00000100"))?.id).toBe("ab12");
    expect(store.counts.stats - before.stats + store.counts.reads - before.reads + store.counts.rangeReads - before.rangeReads).toBe(1);
  });

  test("says nothing of a head larger than MAX_PLAN_HEAD_BYTES (no plan head since version 3 is that large)", async () => {
    const store = new LocalStore(tempDir("identity-large"));
    const padded = JSON.stringify({ id: "ab12", source, pad: "x".repeat(MAX_PLAN_HEAD_BYTES) });
    await store.write(`step_00000100/${PLAN_KEY}`, enc(padded));
    expect(await planIdentityOnRecord(store, "step_00000100")).toEqual({ id: undefined, source: undefined });
  });
});
