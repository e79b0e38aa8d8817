import { UsageError } from "../errors.js";
import type { SentencePieceModel } from "./sentencepiece.js";

/**
 * The tokenizer files of an export, so that `AutoTokenizer.from_pretrained(export)` and
 * `pipeline("text-generation", model=export)` work with nothing else: `tokenizer.json` (the `tokenizers`
 * library's format, which transformers loads without the `sentencepiece` package, unlike a slow
 * `tokenizer.model`), `tokenizer_config.json` and `special_tokens_map.json`.
 *
 * From a sentencepiece BPE model, tokenizer.json reproduces sentencepiece's own encoding (the ids AXLearn's
 * seqio vocabulary gives), checked piece by piece and on a corpus against the `sentencepiece` package
 * (test/hf/tokenizer-consumers.test.ts):
 * - the dummy prefix is a normalizer (Prepend "▁"), as sentencepiece adds it to the whole text: a Metaspace
 *   pre-tokenizer's "first" scheme skips text that already starts with a space (what transformers' Llama
 *   conversion gets wrong on leading spaces);
 * - no pre-splitting on spaces: AXLearn's models are trained with split_by_whitespace false and
 *   allow_whitespace_only_pieces, so runs of spaces are pieces of their own;
 * - user-defined symbols (AXLearn's `<n>`) are isolated by a Split pre-tokenizer and taken whole from the
 *   vocabulary (BPE ignore_merges), as sentencepiece matches them before merging;
 * - merges are every split of a piece into two pieces, by the merged piece's score: sentencepiece's BPE merges
 *   the adjacent pair whose union scores highest.
 *
 * Newlines: fuji's training input replaces "\n" by `<n>` before tokenizing
 * (axlearn/experiments/text/gpt/common.py REPLACE_NEWLINES_WITH, input_text.py tokenize_example), so a model
 * saw every newline as `<n>`; its evaluation input keeps "\n", which these vocabularies have only inside a
 * few pieces ("." + "\n"). A served model is prompted as it was trained, so the tokenizer maps "\n" to `<n>`
 * when the vocabulary has that user-defined piece, and decodes `<n>` back to "\n".
 *
 * Special tokens (the ids AXLearn uses): end of sequence and padding are the sentencepiece model's eos_id and
 * pad_id (1 and 0 for AXLearn's vocabularies; the decoder's defaults too: axlearn/common/decoder.py,
 * pad_token_id 0, eos_token_id 1). fuji adds no BOS: every document starts with EOS (axlearn/common/input_lm.py:
 * text_to_lm_training_input rolls the EOS-terminated stream by one, text_to_lm_eval_input prepends eos_id;
 * sample decoding's default prefix is [eos_id]), so the tokenizer prepends EOS and bos_token_id is EOS's id.
 */

export interface SpecialIds {
  /** The first token of every sequence: AXLearn's EOS. */
  readonly bos: number;
  readonly eos: number;
  readonly pad: number;
}

export interface TokenizerFile {
  readonly name: string;
  readonly bytes: Uint8Array;
}

/** The files' names, in the order ExportTokenizer.files gives them. */
const FILE_NAMES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"] as const;

export interface ExportTokenizer {
  /** The files, tokenizer_config.json's model_max_length being `maxLength` (config.json's max_position_embeddings). */
  files(maxLength: number): TokenizerFile[];
  /** Their names, without making them (the summary's). */
  readonly names: readonly string[];
  readonly ids: SpecialIds;
  /** Ids the tokenizer can give: at most the embedding's rows. */
  readonly size: number;
  /** What it was made from, for the summary line. */
  readonly description: string;
}

type Json = Record<string, unknown>;

const text = new TextEncoder();
const jsonFile = (name: string, value: unknown, indent = 2): TokenizerFile => ({
  name,
  bytes: text.encode(`${JSON.stringify(value, null, indent)}\n`),
});

/** Every split of a piece into two normal pieces, ordered as sentencepiece's BPE applies them. */
export function bpeMerges(model: SentencePieceModel): [string, string][] {
  const normal = new Map<string, number>();
  model.pieces.forEach((p, i) => {
    if (p.type === "normal") normal.set(p.piece, i);
  });
  const found: { score: number; id: number; left: number; right: number; pair: [string, string] }[] = [];
  model.pieces.forEach((p, id) => {
    if (p.type !== "normal") return;
    const s = p.piece;
    for (let k = 1; k < s.length; k++) {
      // Between characters only (sentencepiece's symbols are code points): never inside a surrogate pair.
      const c = s.charCodeAt(k);
      if (c >= 0xdc00 && c <= 0xdfff) continue;
      const a = s.slice(0, k);
      const b = s.slice(k);
      const left = normal.get(a);
      const right = normal.get(b);
      if (left !== undefined && right !== undefined) found.push({ score: p.score, id, left, right, pair: [a, b] });
    }
  });
  found.sort((x, y) => y.score - x.score || x.id - y.id || x.left - y.left || x.right - y.right);
  return found.map((f) => f.pair);
}

const SPACE = "\u2581";
const escapeRegex = (s: string) => s.replace(/[\\^$.|?*+()[\]{}-]/g, "\\$&");

/** tokenizer.json's template: EOS, then the text (a pair: EOS A EOS B, as documents are packed). */
function eosFirst(eos: string, eosId: number): Json {
  const special = (type_id: number) => ({ SpecialToken: { id: eos, type_id } });
  const seq = (id: string, type_id: number) => ({ Sequence: { id, type_id } });
  return {
    type: "TemplateProcessing",
    single: [special(0), seq("A", 0)],
    pair: [special(0), seq("A", 0), special(1), seq("B", 1)],
    special_tokens: { [eos]: { id: eos, ids: [eosId], tokens: [eos] } },
  };
}

/**
 * tokenizer.json for a sentencepiece BPE model; refuses (UsageError naming `path` and the field) what it does
 * not reproduce.
 */
export function tokenizerJsonFromSentencePiece(model: SentencePieceModel, path: string): { json: Json; newlines: boolean } {
  const refuse = (field: string, why: string): never => {
    throw new UsageError(
      `${field} ${why}: orbax2reg converts sentencepiece BPE models only; give the model's tokenizer.json instead (transformers: AutoTokenizer.from_pretrained(...).save_pretrained(folder))`,
      { path },
    );
  };
  if (model.modelType !== "bpe") refuse("trainer_spec.model_type", `is ${model.modelType.toUpperCase()}`);
  if (model.treatWhitespaceAsSuffix) refuse("trainer_spec.treat_whitespace_as_suffix", "is true");
  const n = model.normalizer;
  const userDefined = model.pieces.filter((p) => p.type === "user_defined").map((p) => p.piece);
  const newlines = userDefined.includes("<n>");
  const space = n.escapeWhitespaces ? SPACE : " ";
  const normalizers: Json[] = [];
  if (newlines) normalizers.push({ type: "Replace", pattern: { String: "\n" }, content: "<n>" });
  if (n.precompiledCharsmap.length > 0)
    normalizers.push({ type: "Precompiled", precompiled_charsmap: Buffer.from(n.precompiledCharsmap).toString("base64") });
  if (n.removeExtraWhitespaces)
    normalizers.push(
      { type: "Strip", strip_left: true, strip_right: true },
      { type: "Replace", pattern: { Regex: " {2,}" }, content: " " },
    );
  if (n.addDummyPrefix) normalizers.push({ type: "Prepend", prepend: space });
  if (n.escapeWhitespaces) normalizers.push({ type: "Replace", pattern: { String: " " }, content: SPACE });
  const symbols = [...userDefined].sort((a, b) => b.length - a.length);
  const preTokenizer =
    symbols.length === 0
      ? null
      : {
          type: "Split",
          pattern: symbols.length === 1 ? { String: symbols[0] } : { Regex: symbols.map(escapeRegex).join("|") },
          behavior: "Isolated",
          invert: false,
        };
  const vocab: Record<string, number> = {};
  model.pieces.forEach((p, i) => {
    vocab[p.piece] = i;
  });
  const merges = bpeMerges(model);
  // "a b" strings, which every version of `tokenizers` reads, unless a piece holds a space (then pairs, 0.20+).
  const spaced = model.pieces.some((p) => p.piece.includes(" "));
  const eos = model.pieces[model.eosId]?.piece;
  const decoders: Json[] = [];
  if (newlines) decoders.push({ type: "Replace", pattern: { String: "<n>" }, content: "\n" });
  if (n.escapeWhitespaces) decoders.push({ type: "Replace", pattern: { String: SPACE }, content: " " });
  if (model.byteFallback) decoders.push({ type: "ByteFallback" });
  decoders.push({ type: "Fuse" });
  if (n.addDummyPrefix) decoders.push({ type: "Strip", content: " ", start: 1, stop: 0 });
  const json: Json = {
    version: "1.0",
    truncation: null,
    padding: null,
    // Control pieces are special tokens (skipped by decode(skip_special_tokens=True)). A control piece's text in
    // the input becomes its id here, where sentencepiece spells it out: the one difference, as in every
    // converted Llama tokenizer.
    added_tokens: model.pieces.flatMap((p, id) =>
      p.type === "control"
        ? [{ id, content: p.piece, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }]
        : [],
    ),
    normalizer: normalizers.length === 0 ? null : { type: "Sequence", normalizers },
    pre_tokenizer: preTokenizer,
    post_processor: eos === undefined ? null : eosFirst(eos, model.eosId),
    decoder: { type: "Sequence", decoders },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: model.unkPiece,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: true,
      byte_fallback: model.byteFallback,
      ignore_merges: symbols.length > 0,
      vocab,
      merges: spaced ? merges : merges.map(([a, b]) => `${a} ${b}`),
    },
  };
  return { json, newlines };
}

/** The export's tokenizer files from a sentencepiece model. */
export function fromSentencePiece(
  model: SentencePieceModel,
  path: string,
  description: string,
  o: { embeddingRows: number },
): ExportTokenizer {
  if (model.eosId < 0 || model.eosId >= model.pieces.length)
    throw new UsageError("trainer_spec.eos_id is unset: a model without an end-of-sequence piece cannot stop generating", { path });
  const { json, newlines } = tokenizerJsonFromSentencePiece(model, path);
  const piece = (id: number) => model.pieces[id]?.piece as string;
  const pad = model.padId >= 0 ? model.padId : model.eosId;
  const ids = { bos: model.eosId, eos: model.eosId, pad };
  const names = { bos: piece(ids.bos), eos: piece(ids.eos), pad: piece(ids.pad), unk: model.unkPiece };
  return finish(json, ids, names, model.pieces.length, `${description}${newlines ? ", newlines as <n>" : ""}`, path, o);
}

/**
 * The export's tokenizer files from a user's tokenizer.json (for instance Llama 3's, which fuji v3-tiktoken is
 * trained with: AXLearn's FujiV3Vocabulary, axlearn/experiments/text/gpt/vocabulary_fuji_v3.py, takes EOS as
 * <|end_of_text|> and padding as <|pad_id|> or <|finetune_right_pad_id|>, and drops the BOS the tokenizer adds).
 * Its model, normalizer and pre-tokenizer are kept; its template becomes AXLearn's (EOS first).
 */
export function fromTokenizerJson(bytes: Uint8Array, path: string, o: { embeddingRows: number }): ExportTokenizer {
  let json: Json;
  try {
    json = JSON.parse(new TextDecoder().decode(bytes)) as Json;
  } catch (e) {
    throw new UsageError(`not a tokenizer.json (${(e as Error).message.split("\n")[0]})`, { path });
  }
  const model = json.model as { vocab?: unknown } | undefined;
  if (json === null || typeof json !== "object" || model === undefined || typeof model !== "object")
    throw new UsageError("not a tokenizer.json (no model)", { path });
  const ids = new Map<string, number>();
  const vocab = model.vocab;
  if (Array.isArray(vocab)) {
    // A Unigram model's vocabulary: [piece, score] pairs, ids in order.
    vocab.forEach((e, i) => {
      if (Array.isArray(e) && typeof e[0] === "string") ids.set(e[0], i);
    });
  } else if (vocab !== null && typeof vocab === "object") {
    for (const [k, v] of Object.entries(vocab as Record<string, unknown>)) if (typeof v === "number") ids.set(k, v);
  }
  for (const t of (json.added_tokens ?? []) as { id?: unknown; content?: unknown }[])
    if (typeof t.content === "string" && typeof t.id === "number") ids.set(t.content, t.id);
  const first = (names: readonly string[]) => names.find((n) => ids.has(n));
  const eos = first(["<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>"]);
  if (eos === undefined) throw new UsageError("names no end-of-sequence token (<|end_of_text|>, </s>, <|endoftext|> or <eos>)", { path });
  const pad = first(["<|pad_id|>", "<|finetune_right_pad_id|>", "<pad>"]) ?? eos;
  const idOf = (n: string) => ids.get(n) as number;
  const size = Math.max(...ids.values()) + 1;
  json.post_processor = eosFirst(eos, idOf(eos));
  const unk = first(["<unk>"]);
  return finish(
    json,
    { bos: idOf(eos), eos: idOf(eos), pad: idOf(pad) },
    { bos: eos, eos, pad, ...(unk === undefined ? {} : { unk }) },
    size,
    "the given tokenizer.json, EOS first",
    path,
    o,
  );
}

function finish(
  json: Json,
  ids: SpecialIds,
  names: { bos: string; eos: string; pad: string; unk?: string },
  size: number,
  description: string,
  path: string,
  o: { embeddingRows: number },
): ExportTokenizer {
  if (size > o.embeddingRows)
    throw new UsageError(`has ${size} tokens, more than the model's ${o.embeddingRows} embedding rows: not this model's tokenizer`, {
      path,
    });
  const special = {
    bos_token: names.bos,
    eos_token: names.eos,
    pad_token: names.pad,
    ...(names.unk === undefined ? {} : { unk_token: names.unk }),
  };
  const config = (maxLength: number) => ({
    // The generic class: it takes tokenizer.json as written (LlamaTokenizerFast would rebuild the template).
    tokenizer_class: "PreTrainedTokenizerFast",
    ...special,
    model_max_length: maxLength,
    clean_up_tokenization_spaces: false,
  });
  const tokenizerJson = text.encode(JSON.stringify(json));
  return {
    files: (maxLength) => [
      { name: FILE_NAMES[0], bytes: tokenizerJson },
      jsonFile(FILE_NAMES[1], config(maxLength)),
      jsonFile(FILE_NAMES[2], special),
    ],
    names: FILE_NAMES,
    ids,
    size,
    description,
  };
}
