import { MetadataError } from "../errors.js";
import { isObject } from "./pytree-metadata.js";

/** The parts of a step's `_CHECKPOINT_METADATA` we use; every field is optional (orbax versions differ). */
export interface CheckpointMetadata {
  /** item name -> handler type name; a single string for single-item checkpoints. */
  readonly itemHandlers: Readonly<Record<string, string>> | string | undefined;
  readonly commitTimestampNs: bigint | undefined;
}

const text = new TextDecoder();

export function parseCheckpointMetadata(bytes: Uint8Array, path: string): CheckpointMetadata {
  let json: unknown;
  try {
    json = JSON.parse(text.decode(bytes));
  } catch (e) {
    throw new MetadataError(`not valid JSON (${(e as Error).message})`, { path });
  }
  if (!isObject(json)) throw new MetadataError("not a JSON object", { path });
  const handlers = json.item_handlers;
  if (handlers !== undefined && handlers !== null && typeof handlers !== "string") {
    if (!isObject(handlers) || !Object.values(handlers).every((v) => typeof v === "string")) {
      throw new MetadataError("must be a string or an object of strings", { path, key: "item_handlers" });
    }
  }
  const ts = json.commit_timestamp_nsecs;
  return {
    itemHandlers: (handlers ?? undefined) as CheckpointMetadata["itemHandlers"],
    commitTimestampNs: Number.isSafeInteger(ts) ? BigInt(ts as number) : undefined,
  };
}

/** Names of items whose handler stores a PyTree (the arrays); "state" first when there are several. */
export function pytreeItems(meta: CheckpointMetadata): string[] {
  if (!isObject(meta.itemHandlers)) return [];
  const names = Object.entries(meta.itemHandlers)
    .filter(([, h]) => /PyTreeCheckpointHandler|StandardCheckpointHandler/.test(h))
    .map(([name]) => name);
  return names.sort((a, b) => (a === "state" ? -1 : b === "state" ? 1 : a < b ? -1 : 1));
}
