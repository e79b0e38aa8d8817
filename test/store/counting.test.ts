import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { CountingStore } from "../../src/store/counting.js";
import { LocalStore } from "../../src/store/local.js";
import type { Store, VersionedObjects } from "../../src/store/store.js";

function tempStore(): LocalStore {
  return new LocalStore(mkdtempSync(join(tmpdir(), "orbax2reg-counting-")));
}

/** A store with versions in memory: only what `versioned` needs; the rest is the local store's. */
function withVersions(inner: Store): Store {
  const objects = new Map<string, { data: Uint8Array; version: string }>();
  let next = 1;
  const versioned: VersionedObjects = {
    get: async (key) => objects.get(key),
    create: async (key, data) => {
      if (objects.has(key)) return undefined;
      const version = String(next++);
      objects.set(key, { data, version });
      return version;
    },
    replace: async (key, data, version) => {
      if (objects.get(key)?.version !== version) return undefined;
      const now = String(next++);
      objects.set(key, { data, version: now });
      return now;
    },
    delete: async (key, version) => objects.get(key)?.version === version && objects.delete(key),
  };
  return Object.assign(Object.create(inner) as Store, { versioned });
}

describe("CountingStore", () => {
  test("offers the optional capabilities the inner store has, and only those", () => {
    const local = new CountingStore(tempStore());
    expect(local.removeAbandoned).toBeTypeOf("function");
    expect(local.removeEmptyDirectories).toBeTypeOf("function");
    expect(local.readRangeInto).toBeTypeOf("function");
    expect(local.versioned).toBeUndefined();
    const bare = new CountingStore(
      Object.assign(Object.create(tempStore()) as Store, {
        removeAbandoned: undefined,
        removeEmptyDirectories: undefined,
        readRangeInto: undefined,
      }),
    );
    expect(bare.removeAbandoned).toBeUndefined();
    expect(bare.removeEmptyDirectories).toBeUndefined();
    expect(bare.readRangeInto).toBeUndefined();
  });

  test("counts readRangeInto as the ranged read it is", async () => {
    const inner = tempStore();
    await inner.write("f", new Uint8Array([1, 2, 3, 4, 5]));
    const store = new CountingStore(inner, { log: true });
    const into = new Uint8Array(3);
    expect([...((await store.readRangeInto?.("f", 1, 3, into)) ?? [])]).toEqual([2, 3, 4]);
    expect(store.counts).toMatchObject({ rangeReads: 1, bytesRead: 3 });
    expect(store.ranges).toEqual([{ key: "f", offset: 1, length: 3 }]);
  });

  test("passes removeAbandoned and removeEmptyDirectories through to the inner store", async () => {
    const inner = tempStore();
    await inner.write("d/e/x", new Uint8Array(1));
    await inner.delete("d/e/x");
    const store = new CountingStore(inner);
    expect(await store.removeAbandoned?.("d/")).toBe(0);
    await store.removeEmptyDirectories?.("d/");
    expect(await inner.listDir("")).toEqual({ files: [], dirs: [] });
  });

  test("counts conditional operations as the reads, writes and deletes they are", async () => {
    const store = new CountingStore(withVersions(tempStore()));
    const versioned = store.versioned;
    if (versioned === undefined) throw new Error("expected versions");
    const v1 = await versioned.create("claim", new Uint8Array(3));
    expect(v1).toBeDefined();
    expect(await versioned.create("claim", new Uint8Array(3))).toBeUndefined();
    expect((await versioned.get("claim"))?.version).toBe(v1);
    const v2 = await versioned.replace("claim", new Uint8Array(5), v1 as string);
    expect(await versioned.delete("claim", v2 as string)).toBe(true);
    expect(store.counts).toMatchObject({ reads: 1, bytesRead: 3, writes: 3, bytesWritten: 11, deletes: 1 });
  });
});
