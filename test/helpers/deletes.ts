// A store whose deletes are recorded as they are done: the tests of what a clean-up removes (retention, cloud
// check) read which keys went, in which order, and whether each delete named the version it listed.
import type { Store } from "../../src/store/store.js";

export interface WatchedDeletes {
  readonly store: Store;
  /** Every key deleted, in order, either way. */
  readonly deleted: string[];
  /** The keys deleted without a version (store.delete). */
  readonly plain: string[];
  /** The keys deleted at one version (store.versioned.delete), with that version. */
  readonly versioned: [key: string, version: string][];
}

/** `store`, with its deletes recorded; `before` runs before each (to fail it, or to write meanwhile). */
export function watchDeletes(store: Store, before: (key: string) => Promise<void> = async () => {}): WatchedDeletes {
  const deleted: string[] = [];
  const plain: string[] = [];
  const versioned: [string, string][] = [];
  const inner = store.versioned;
  const watched = new Proxy(store, {
    get(target, prop) {
      if (prop === "delete")
        return async (key: string) => {
          await before(key);
          deleted.push(key);
          plain.push(key);
          return target.delete(key);
        };
      if (prop === "versioned" && inner !== undefined)
        return {
          ...inner,
          delete: async (key: string, version: string) => {
            await before(key);
            deleted.push(key);
            versioned.push([key, version]);
            return inner.delete(key, version);
          },
        };
      const v = Reflect.get(target, prop, target);
      return typeof v === "function" ? v.bind(target) : v;
    },
  });
  return { store: watched, deleted, plain, versioned };
}
