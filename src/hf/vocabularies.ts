import { readFile } from "node:fs/promises";
import { basename, join } from "node:path";
import { NotFoundError, UsageError } from "../errors.js";
import { openStore } from "../store/open.js";
import { packageRoot } from "../version.js";
import { parseSentencePieceModel } from "./sentencepiece.js";
import { type ExportTokenizer, fromSentencePiece, fromTokenizerJson, type SpecialIds } from "./tokenizer.js";

/**
 * Which tokenizer an export gets, as a table: AXLearn picks a fuji model's vocabulary by its size
 * (axlearn/experiments/text/gpt/c4_trainer.py, _vocab_cfg), so the embedding's rows name it. The sentencepiece
 * files ship with orbax2reg (assets/tokenizers/, AXLearn's own); fuji v3-tiktoken's Llama-3-tokenizer.json is not
 * in AXLearn's repository, so it is the user's to give.
 */
interface Vocabulary {
  readonly fuji: string;
  /** A shipped sentencepiece model, or what to give with --tokenizer. */
  readonly file?: string;
  readonly give?: string;
  /** The ids fuji's config uses with it (fuji.py trainer_configs; decoder.py's defaults otherwise). */
  readonly ids: SpecialIds;
}

/** decoder.py: pad_token_id 0, eos_token_id 1; fuji starts each document with EOS (input_lm.py). */
const SENTENCEPIECE_IDS: SpecialIds = { bos: 1, eos: 1, pad: 0 };

export const FUJI_VOCABULARIES: ReadonlyMap<number, Vocabulary> = new Map([
  [32768, { fuji: "fuji v1/v2", file: "bpe_32k_c4.model", ids: SENTENCEPIECE_IDS }],
  [131072, { fuji: "fuji v3", file: "bpe_128k_c4.model", ids: SENTENCEPIECE_IDS }],
  // fuji.py: `if version == Version.V3_TIKTOKEN: pad_token_id = 128004, eos_token_id = 128001`.
  [
    128256,
    {
      fuji: "fuji v3-tiktoken",
      give: "Llama 3's tokenizer.json (AXLearn's Llama-3-tokenizer.json, not in its repository)",
      ids: { bos: 128001, eos: 128001, pad: 128004 },
    },
  ],
]);

/** What --tokenizer says: a file (local or gs://), none, or the vocabulary's own (undefined). */
export type TokenizerChoice = { readonly file: string } | "none" | undefined;

export interface ChosenTokenizer {
  readonly tokenizer?: ExportTokenizer;
  /** The ids config.json and generation_config.json carry: the tokenizer's, else fuji's for the vocabulary. */
  readonly ids: SpecialIds;
  /** One line: what the export's tokenizer is, or what is missing and how to add it. */
  readonly line: string;
}

export function shippedTokenizer(file: string): string {
  return join(packageRoot(), "assets", "tokenizers", file);
}

/** The export's tokenizer for a model of `rows` embedding rows. */
export async function chooseTokenizer(choice: TokenizerChoice, rows: number): Promise<ChosenTokenizer> {
  const known = FUJI_VOCABULARIES.get(rows);
  const fallbackIds = known?.ids ?? SENTENCEPIECE_IDS;
  const o = { embeddingRows: rows };
  if (choice === "none") return { ids: fallbackIds, line: "none (--tokenizer none)" };
  if (choice !== undefined) {
    const bytes = await readTokenizerFile(choice.file);
    const t = isJson(bytes)
      ? fromTokenizerJson(bytes, choice.file, o)
      : fromSentencePiece(parseSentencePieceModel(bytes, choice.file), choice.file, basename(choice.file), o);
    return { tokenizer: t, ids: t.ids, line: describe(t) };
  }
  if (known?.file !== undefined) {
    const path = shippedTokenizer(known.file);
    const t = fromSentencePiece(parseSentencePieceModel(await readFile(path), path), path, `AXLearn's ${known.file} (${known.fuji})`, o);
    return { tokenizer: t, ids: t.ids, line: describe(t) };
  }
  const why = known?.give === undefined ? `a vocabulary of ${rows} is no fuji tokenizer's` : `${known.fuji} uses ${known.give}`;
  return {
    ids: fallbackIds,
    line: `none: ${why}; add one with --tokenizer FILE (a sentencepiece .model or a tokenizer.json), or the tokenizer files beside the export`,
  };
}

const describe = (t: ExportTokenizer) =>
  `tokenizer.json from ${t.description}; bos/eos ${t.ids.eos}${t.ids.bos === t.ids.eos ? "" : ` (bos ${t.ids.bos})`}, pad ${t.ids.pad}`;

function isJson(bytes: Uint8Array): boolean {
  for (const b of bytes) {
    if (b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09 || b === 0xef || b === 0xbb || b === 0xbf) continue;
    return b === 0x7b;
  }
  return false;
}

async function readTokenizerFile(location: string): Promise<Uint8Array> {
  if (location.startsWith("gs://")) {
    const slash = location.lastIndexOf("/");
    if (slash < "gs://".length || slash === location.length - 1)
      throw new UsageError("--tokenizer names a folder, not a file", { path: location });
    const store = await openStore(location.slice(0, slash));
    return store.read(location.slice(slash + 1));
  }
  try {
    return await readFile(location);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "ENOENT") throw new NotFoundError("no such file (--tokenizer)", { path: location });
    if (code === "EISDIR") throw new UsageError("--tokenizer names a folder, not a file", { path: location });
    throw e;
  }
}
