import { ConflictError } from "../errors.js";
import { describe, type Store } from "../store/store.js";
import { type FileEntry, parseRecord, RECORD_NAME, sha256 } from "./record.js";
import { INDEX_NAME } from "./shards.js";

/**
 * An export-hf destination: a folder `transformers` loads as one checkpoint, so a file of another checkpoint
 * beside the export is one that it, or an upload of the folder, may take for the export's: transformers 5.25's
 * `from_pretrained` of a local folder loads `model.safetensors` ahead of `model.safetensors.index.json`
 * (modeling_utils.py `_get_resolved_checkpoint_files`: `SAFE_WEIGHTS_NAME` is tried before
 * `SAFE_WEIGHTS_INDEX_NAME`), and its tokenizer and config are whatever files of those names are there.
 *
 * Only the folder's own files count (transformers reads a subfolder only when told to); README.md, .gitattributes
 * and any other file are left alone.
 */

/** Weights: any checkpoint format's files and their indexes (safetensors, PyTorch, TF, Flax, GGUF, raw torch saves). */
const WEIGHTS = /\.(safetensors|bin|pt|pth|ckpt|h5|msgpack|gguf)(\.index\.json)?$/;
/**
 * Tokenizer files (transformers' tokenization_utils_base.py and utils/hub.py names: tokenizer.json,
 * tokenizer_config.json, special_tokens_map.json, added_tokens.json, chat_template.jinja; the vocabularies of
 * BPE and WordPiece tokenizers; sentencepiece and tiktoken models).
 */
const TOKENIZER =
  /^(tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab\.(json|txt)|merges\.txt|chat_template\.(jinja|json)|.*\.model|.*\.tiktoken)$/;
/**
 * The model's configuration: config.json and generation_config.json, and a PEFT adapter's, which makes
 * `from_pretrained` (with peft installed) load the base model it names instead (modeling_utils.py `maybe_load_adapters`).
 */
const CONFIG = /^(config\.json|generation_config\.json|adapter_config\.json)$/;

/** Whether a file of this name at the top of a destination belongs to some checkpoint (weights, tokenizer, config). */
export function isCheckpointFile(name: string): boolean {
  return WEIGHTS.test(name) || TOKENIZER.test(name) || CONFIG.test(name);
}

/** Whether a file of this name holds weights (or an index of them). */
export function isWeightFile(name: string): boolean {
  return WEIGHTS.test(name);
}

/** What is at a destination: the files of another checkpoint there, and those an earlier export wrote (its record's). */
export interface DestinationState {
  /** Files of another checkpoint, by name, sorted: refused, or removed with --force. */
  readonly foreign: readonly string[];
  /** The shards and small files there that an earlier export's record names (this export's, or another orbax2reg export's). */
  readonly recorded: readonly string[];
}

/**
 * Sorts the destination's checkpoint files into an earlier export's and another checkpoint's. An earlier export
 * is known by its record (`previousRecord`, the text at RECORD_NAME): its shards by name (a rerun checks their
 * header before keeping one), its small files by name and sha256 (a file of that name with other bytes was
 * put there since, so it is not the export's), its index. Without a readable record, every checkpoint file is
 * another checkpoint's.
 */
export async function inspectDestination(dest: Store, previousRecord: string | undefined): Promise<DestinationState> {
  const record = previousRecord === undefined ? undefined : parseRecord(previousRecord);
  const shards = new Set(record?.shards.map((s) => s.name));
  const files = new Map<string, FileEntry>(record?.files.map((f) => [f.name, f]));
  const listing = await dest.listDir("");
  const foreign: string[] = [];
  const recorded: string[] = [];
  for (const info of listing.files) {
    const name = info.key.slice(info.key.lastIndexOf("/") + 1);
    if (name === RECORD_NAME || !isCheckpointFile(name)) continue;
    if (record !== undefined && (shards.has(name) || name === INDEX_NAME)) {
      recorded.push(name);
      continue;
    }
    const entry = files.get(name);
    if (
      entry !== undefined &&
      (entry.sha256 === undefined || (entry.bytes === info.size && sha256(await dest.read(info.key)) === entry.sha256))
    ) {
      recorded.push(name);
      continue;
    }
    foreign.push(name);
  }
  return { foreign: foreign.sort(), recorded };
}

/**
 * Removes what interrupted writes left at the top of the destination: a local write goes through
 * `<name>.tmp-<pid><seq>` renamed into place, and a killed run leaves that file, which no listing shows and an
 * upload of the folder would publish. Only files whose writing process is gone (a running export's are never
 * touched); only orbax2reg names them so. GCS leaves nothing to remove and has no abandonedIn: an upload makes
 * no object until it completes ("Once a resumable upload completes, the uploaded object replaces any existing
 * object with the same name", https://cloud.google.com/storage/docs/xml-api/post-object-resumable).
 */
export async function removeInterruptedWrites(dest: Store): Promise<void> {
  for (const key of (await dest.abandonedIn?.("")) ?? []) await dest.delete(key);
}

/** The refusal of a destination holding another checkpoint's files: names at most five, and how many more. */
export function foreignFilesError(dest: Store, foreign: readonly string[]): ConflictError {
  const shown = foreign.slice(0, 5).join(", ");
  const more = foreign.length > 5 ? ` and ${foreign.length - 5} more` : "";
  return new ConflictError(`holds files of another checkpoint (${shown}${more}), not this export's; --force removes them`, {
    path: describe(dest, ""),
  });
}
