import { MetadataError } from "../errors.js";

/** One level of a PyTree key path, as `_METADATA`'s key_metadata records it (1 = sequence, 2 = dict). */
export interface TreeKey {
  readonly key: string;
  readonly type: "sequence" | "dict";
}

/** Value types whose data is a zarr array in the item's key-value store. */
const ARRAY_TYPES = new Set(["jax.Array", "np.ndarray", "scalar"]);
/** What Orbax records for an empty subtree (AXLearn's parameterless children: dropout, kv_cache, ...): no data. */
const EMPTY_NODE_TYPES = new Set(["Dict", "List", "Tuple", "None"]);

export interface Leaf {
  readonly keys: readonly TreeKey[];
  /** Orbax's parameter name: the keys joined with "." (the OCDBT key prefix). */
  readonly name: string;
  /** AXLearn's path: the keys joined with "/". */
  readonly path: string;
  readonly valueType: string;
  readonly skipDeserialize: boolean;
  readonly writeShape: readonly number[] | undefined;
  /** True when the leaf's data is a zarr array (jax.Array, np.ndarray, scalar). */
  readonly isArray: boolean;
  /** True for an empty dict, list, tuple or None that Orbax keeps only to rebuild the tree's structure. */
  readonly isEmptyNode: boolean;
}

export interface PyTreeMetadata {
  /** Leaves in the order `_METADATA` lists them (Orbax writes jax flatten order). */
  readonly leaves: readonly Leaf[];
  readonly useZarr3: boolean;
  readonly useOcdbt: boolean | undefined;
  readonly storeDataEqualToFillValue: boolean;
}

const text = new TextDecoder();

export function makeLeaf(keys: readonly TreeKey[], valueType: string, skipDeserialize = false, writeShape?: readonly number[]): Leaf {
  return {
    keys,
    name: keys.map((k) => k.key).join("."),
    path: keys.map((k) => k.key).join("/"),
    valueType,
    skipDeserialize,
    writeShape,
    isArray: ARRAY_TYPES.has(valueType) && !skipDeserialize,
    isEmptyNode: skipDeserialize && EMPTY_NODE_TYPES.has(valueType),
  };
}

/** Parses an item's `_METADATA` (orbax `_src/metadata/tree.py`). `path` names the file in errors. */
export function parsePyTreeMetadata(bytes: Uint8Array, path: string): PyTreeMetadata {
  let json: unknown;
  try {
    json = JSON.parse(text.decode(bytes));
  } catch (e) {
    throw new MetadataError(`not valid JSON (${(e as Error).message})`, { path });
  }
  const fail = (key: string, detail: string): never => {
    throw new MetadataError(detail, { path, key });
  };
  if (!isObject(json)) return fail("", "_METADATA is not a JSON object");
  const tree = json.tree_metadata;
  if (!isObject(tree)) return fail("tree_metadata", "missing or not an object");
  const leaves: Leaf[] = [];
  for (const [treeKey, entry] of Object.entries(tree)) {
    const at = `tree_metadata.${treeKey}`;
    if (!isObject(entry)) fail(at, "entry is not an object");
    const km = (entry as Record<string, unknown>).key_metadata;
    if (!Array.isArray(km) || km.length === 0) fail(`${at}.key_metadata`, "missing or not a non-empty list");
    const keys = (km as unknown[]).map((k, i): TreeKey => {
      if (!isObject(k) || typeof k.key !== "string") return fail(`${at}.key_metadata[${i}].key`, "missing or not a string");
      if (k.key_type !== 1 && k.key_type !== 2)
        return fail(`${at}.key_metadata[${i}].key_type`, `must be 1 (sequence) or 2 (dict), got ${JSON.stringify(k.key_type)}`);
      return { key: k.key, type: k.key_type === 1 ? "sequence" : "dict" };
    });
    const vm = (entry as Record<string, unknown>).value_metadata;
    if (!isObject(vm)) return fail(`${at}.value_metadata`, "missing or not an object");
    if (typeof vm.value_type !== "string") fail(`${at}.value_metadata.value_type`, "missing or not a string");
    const skip = vm.skip_deserialize ?? false;
    if (typeof skip !== "boolean") fail(`${at}.value_metadata.skip_deserialize`, "not a boolean");
    const ws = vm.write_shape;
    if (ws !== undefined && ws !== null && !(Array.isArray(ws) && ws.every((x) => Number.isSafeInteger(x) && x >= 0))) {
      fail(`${at}.value_metadata.write_shape`, "not a list of non-negative integers");
    }
    leaves.push(makeLeaf(keys, vm.value_type as string, skip as boolean, (ws ?? undefined) as number[] | undefined));
  }
  const useZarr3 = json.use_zarr3 ?? false;
  if (typeof useZarr3 !== "boolean") fail("use_zarr3", "not a boolean");
  const useOcdbt = json.use_ocdbt;
  if (useOcdbt !== undefined && typeof useOcdbt !== "boolean") fail("use_ocdbt", "not a boolean");
  const fillFlag = json.store_array_data_equal_to_fill_value ?? false;
  if (typeof fillFlag !== "boolean") fail("store_array_data_equal_to_fill_value", "not a boolean");
  return {
    leaves,
    useZarr3: useZarr3 as boolean,
    useOcdbt: useOcdbt as boolean | undefined,
    storeDataEqualToFillValue: fillFlag as boolean,
  };
}

export function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
