// What a conversion asks of the destination in series: each request another waits for is a round trip of
// tens of ms on Cloud Storage. Independent looks go out together; what this process has just written in
// memory is not read back.
import { afterEach, describe, expect, test, vi } from "vitest";
import { convert, loadPlan, planPhase } from "../../src/convert/convert.js";
import { DEFAULT_EXECUTE } from "../../src/convert/execute.js";
import { finalize, Shortfall } from "../../src/convert/finalize.js";
import { LocalStore } from "../../src/store/local.js";
import type { Store } from "../../src/store/store.js";
import { FIXTURES } from "../helpers/paths.js";
import { tempDir } from "../helpers/tmp.js";

const TINY = `${FIXTURES}/orbax-axlearn/tiny/step_00000100`;
const OPTIONS = { groups: 1, paramsOnly: false, allowUncommitted: false, force: false, dryRun: false };

afterEach(() => vi.restoreAllMocks());

/** Every request made through a LocalStore, in the order made: the store's root and the key. */
function recordRequests(): { root: string; method: string; key: string }[] {
  const calls: { root: string; method: string; key: string }[] = [];
  for (const method of ["read", "readRange", "readHead", "readStream", "stat", "list"] as const) {
    const original = LocalStore.prototype[method] as (this: LocalStore, key: string, ...rest: unknown[]) => unknown;
    vi.spyOn(LocalStore.prototype, method).mockImplementation(function (this: LocalStore, key: string, ...rest: unknown[]) {
      calls.push({ root: this.url, method, key });
      return original.call(this, key, ...rest);
    } as never);
  }
  return calls;
}

describe("the plan phase", () => {
  test("asks for the destination's index before the plan reads the source's b-tree nodes, not after them", async () => {
    const dest = tempDir("trips-index");
    const calls = recordRequests();
    await planPhase(TINY, dest, OPTIONS);
    const index = calls.findIndex((c) => c.method === "stat" && c.key === "step_00000100/index");
    // The OCDBT database's nodes, in its data files under d/ (the manifest and _METADATA come before: openStep).
    const tree = calls.findIndex((c) => c.key.startsWith("state/d/"));
    expect(index).toBeGreaterThanOrEqual(0);
    expect(tree).toBeGreaterThanOrEqual(0);
    expect(index).toBeLessThan(tree);
    // Looked at once: the claim takes what the early look saw.
    expect(calls.filter((c) => c.key === "step_00000100/index")).toHaveLength(1);
  });

  test("makes no look at the destination's index on a dry run", async () => {
    const dest = tempDir("trips-dry");
    const calls = recordRequests();
    await planPhase(TINY, dest, { ...OPTIONS, dryRun: true });
    expect(calls.filter((c) => c.key.endsWith("/index") && c.root.includes(dest))).toEqual([]);
  });
});

describe("a conversion in one process", () => {
  test("runs a plan of one part from what it wrote, without reading the part back", async () => {
    const dest = tempDir("trips-part");
    const calls = recordRequests();
    const result = await convert(TINY, dest, { ...OPTIONS, ...DEFAULT_EXECUTE });
    expect(result.finalize?.indexWritten).toBe(true);
    expect(result.plan.groups.reduce((n, g) => n + g.parts, 0)).toBe(1);
    const partReads = calls.filter((c) => /\/plans\/[^/]+\/.*part/.test(c.key) && c.method !== "list" && c.method !== "stat");
    expect(partReads).toEqual([]);
  });

  test("reads its part back when the plan was already on record (a resumed conversion)", async () => {
    const dest = tempDir("trips-resumed");
    await planPhase(TINY, dest, OPTIONS);
    const calls = recordRequests();
    const result = await convert(TINY, dest, { ...OPTIONS, ...DEFAULT_EXECUTE });
    expect(result.reused).toBe(true);
    expect(calls.filter((c) => /\/plans\/[^/]+\/.*part/.test(c.key) && c.method === "read").length).toBeGreaterThan(0);
  });
});

/** A store that counts the requests in flight at once (a listing is in flight until it is read to its end). */
function inFlightOf(inner: Store): { store: Store; most: () => number } {
  let now = 0;
  let most = 0;
  const start = () => {
    now++;
    most = Math.max(most, now);
  };
  const store = new Proxy(inner, {
    get(target, name, receiver) {
      const value = Reflect.get(target, name, receiver);
      if (typeof value !== "function") return value;
      if (name === "list") {
        return async function* (prefix: string) {
          start();
          try {
            yield* target.list(prefix);
          } finally {
            now--;
          }
        };
      }
      if (!["read", "readHead", "readRange", "stat"].includes(String(name))) return value.bind(target);
      return async (...args: unknown[]) => {
        start();
        try {
          return await value.apply(target, args);
        } finally {
          now--;
        }
      };
    },
  });
  return { store, most: () => most };
}

describe("finalize after the parts were checked", () => {
  test("sends the owner's look, the index's read and the step's listing together", async () => {
    const dest = tempDir("trips-finalize");
    await convert(TINY, dest, { ...OPTIONS, ...DEFAULT_EXECUTE });
    const { plan, destination, source } = await loadPlan(dest, 100);
    const watched = inFlightOf(destination);
    await finalize(plan, source, watched.store, { checked: new Shortfall() });
    expect(watched.most()).toBeGreaterThanOrEqual(3);
  });

  test("lists a large step only after the owner's look, so that a refusal is not held up by a long listing", async () => {
    const dest = tempDir("trips-finalize-large");
    await convert(TINY, dest, { ...OPTIONS, ...DEFAULT_EXECUTE });
    const { plan, destination, source } = await loadPlan(dest, 100);
    const watched = inFlightOf(destination);
    const large = { ...plan, totals: { ...plan.totals, objects: 5000 } };
    await finalize(large, source, watched.store, { checked: new Shortfall() });
    expect(watched.most()).toBe(2);
  });
});
