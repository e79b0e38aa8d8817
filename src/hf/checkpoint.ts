import { FormatError, MetadataError, NotFoundError } from "../errors.js";
import { describe, type Store } from "../store/store.js";
import { headerLength, parseHeader, STORED_BYTES, type StoredDtype } from "./safetensors.js";
import { INDEX_NAME } from "./shards.js";

/**
 * A Hugging Face checkpoint folder as transformers' `save_pretrained` leaves it: config.json, and the weights in
 * one `model.safetensors` or in shards named by `model.safetensors.index.json`'s weight_map
 * (transformers utils/hub.py, get_checkpoint_shard_files). Only the headers are read here: each tensor's
 * file, dtype, shape and byte range, for ranged reads later.
 */
export const SINGLE_FILE = "model.safetensors";

export interface HfTensor {
  readonly name: string;
  readonly file: string;
  readonly dtype: StoredDtype;
  readonly shape: readonly number[];
  /** Where its bytes start in `file` (header included) and how many there are. */
  readonly offset: number;
  readonly bytes: number;
}

export interface HfCheckpoint {
  readonly config: Record<string, unknown>;
  /** config.json's bytes, for the import's record (a changed config is another import). */
  readonly configText: string;
  readonly files: readonly string[];
  readonly tensors: ReadonlyMap<string, HfTensor>;
}

const DTYPES: readonly StoredDtype[] = ["F32", "BF16", "F16"];

export async function openHfCheckpoint(store: Store): Promise<HfCheckpoint> {
  const configText = await readText(store, "config.json", "config.json missing: not a Hugging Face model folder");
  let config: unknown;
  try {
    config = JSON.parse(configText);
  } catch (e) {
    throw new MetadataError(`config.json is not JSON (${(e as Error).message})`, { path: describe(store, "config.json") });
  }
  if (typeof config !== "object" || config === null || Array.isArray(config))
    throw new MetadataError("config.json is not a JSON object", { path: describe(store, "config.json") });

  // The index when there is one (a sharded save), else the single file.
  let weightMap: Map<string, string> | undefined;
  if ((await store.stat(INDEX_NAME)) !== undefined) {
    const where = describe(store, INDEX_NAME);
    let index: unknown;
    try {
      index = JSON.parse(await readText(store, INDEX_NAME, ""));
    } catch (e) {
      throw new MetadataError(`not JSON (${(e as Error).message})`, { path: where });
    }
    const map = (index as { weight_map?: unknown } | null)?.weight_map;
    if (typeof map !== "object" || map === null || Array.isArray(map) || !Object.values(map).every((f) => typeof f === "string"))
      throw new MetadataError("weight_map (tensor name -> file) missing or not an object of strings", { path: where, key: "weight_map" });
    weightMap = new Map(Object.entries(map as Record<string, string>));
  } else if ((await store.stat(SINGLE_FILE)) === undefined) {
    throw new NotFoundError(`neither ${INDEX_NAME} nor ${SINGLE_FILE}: no safetensors weights (a PyTorch .bin checkpoint is not read)`, {
      path: store.url,
    });
  }
  const files = weightMap === undefined ? [SINGLE_FILE] : [...new Set(weightMap.values())].sort();
  const tensors = new Map<string, HfTensor>();
  for (const file of files) {
    const where = describe(store, file);
    const info = await store.stat(file);
    if (info === undefined) throw new NotFoundError(`named by ${INDEX_NAME} but missing`, { path: where });
    const n = headerLength(await store.readRange(file, 0, Math.min(8, info.size)), where);
    if (8 + n > info.size) throw new FormatError(`safetensors header of ${n} bytes runs past the file's ${info.size}`, { path: where });
    const header = parseHeader(await store.readRange(file, 0, 8 + n), where, DTYPES);
    for (const t of header.tensors) {
      if (header.dataStart + t.end > info.size)
        throw new FormatError(`tensor ${t.name} runs past the end of the file (${info.size} bytes)`, { path: where });
      if (tensors.has(t.name)) throw new FormatError(`tensor ${t.name} is in two files`, { path: where });
      if (weightMap !== undefined && weightMap.get(t.name) !== file)
        throw new FormatError(`tensor ${t.name} is in ${file} but ${INDEX_NAME} says ${weightMap.get(t.name) ?? "nothing"}`, {
          path: where,
        });
      tensors.set(t.name, {
        name: t.name,
        file,
        dtype: t.dtype,
        shape: t.shape,
        offset: header.dataStart + t.begin,
        bytes: t.shape.reduce((a, b) => a * b, 1) * STORED_BYTES[t.dtype],
      });
    }
  }
  for (const [name, file] of weightMap ?? [])
    if (!tensors.has(name))
      throw new FormatError(`${INDEX_NAME} names tensor ${name} in ${file}, whose header lacks it`, { path: describe(store, file) });
  return { config: config as Record<string, unknown>, configText, files, tensors };
}

async function readText(store: Store, key: string, missing: string): Promise<string> {
  try {
    return new TextDecoder().decode(await store.read(key));
  } catch (e) {
    if (e instanceof NotFoundError && missing !== "") throw new NotFoundError(missing, { path: describe(store, key) });
    throw e;
  }
}
