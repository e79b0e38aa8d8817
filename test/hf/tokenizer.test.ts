// The export's tokenizer files, as a table of what each input gives (the ids themselves are checked against the
// real sentencepiece and transformers in tokenizer-consumers.test.ts).
import { readFileSync } from "node:fs";
import { describe, expect, test } from "vitest";
import { FormatError, UsageError } from "../../src/errors.js";
import { type Piece, parseSentencePieceModel, type SentencePieceModel } from "../../src/hf/sentencepiece.js";
import { bpeMerges, fromTokenizerJson, tokenizerJsonFromSentencePiece } from "../../src/hf/tokenizer.js";
import { chooseTokenizer, shippedTokenizer } from "../../src/hf/vocabularies.js";
import { emulatorStorage, newBucket } from "../helpers/gcs.js";

const model = (pieces: [string, number, Piece["type"]][], over: Partial<SentencePieceModel> = {}): SentencePieceModel => ({
  pieces: pieces.map(([piece, score, type]) => ({ piece, score, type })),
  modelType: "bpe",
  byteFallback: true,
  treatWhitespaceAsSuffix: false,
  unkPiece: "<unk>",
  eosId: 1,
  padId: 0,
  normalizer: {
    name: "identity",
    precompiledCharsmap: new Uint8Array(),
    addDummyPrefix: true,
    removeExtraWhitespaces: false,
    escapeWhitespaces: true,
  },
  ...over,
});

const tiny = model([
  ["<pad>", 0, "control"],
  ["</s>", 0, "control"],
  ["<unk>", 0, "unknown"],
  ["<n>", 0, "user_defined"],
  ["▁", -1, "normal"],
  ["a", -2, "normal"],
  ["b", -3, "normal"],
  ["ab", -4, "normal"],
  ["▁ab", -5, "normal"],
  ["▁a", -6, "normal"],
]);

describe("AXLearn's shipped vocabularies", () => {
  test.each([
    ["bpe_32k_c4.model", 32000],
    ["bpe_128k_c4.model", 128000],
  ])("%s decodes: %i pieces, pad 0, eos 1, <n> user-defined, BPE with byte fallback, identity rules kept", (file, pieces) => {
    const path = shippedTokenizer(file);
    const m = parseSentencePieceModel(readFileSync(path), path);
    expect(m.pieces.length).toBe(pieces);
    expect([m.padId, m.eosId, m.modelType, m.byteFallback]).toEqual([0, 1, "bpe", true]);
    expect(m.pieces.slice(0, 5).map((p) => [p.piece, p.type])).toEqual([
      ["<pad>", "control"],
      ["</s>", "control"],
      ["<unk>", "unknown"],
      ["<mask>", "control"],
      ["<n>", "user_defined"],
    ]);
    // bpe_32k.json: remove_extra_whitespaces false, identity normalization (proto2's default would be true).
    expect(m.normalizer).toMatchObject({ name: "identity", addDummyPrefix: true, removeExtraWhitespaces: false });
  });
});

test("bytes that are not a sentencepiece model are refused naming the file", () => {
  expect(() => parseSentencePieceModel(new TextEncoder().encode("not a model at all"), "x/tokenizer.model")).toThrow(FormatError);
  expect(() => parseSentencePieceModel(new TextEncoder().encode("not a model at all"), "x/tokenizer.model")).toThrow(/x\/tokenizer.model/);
});

test("merges are every split into two normal pieces, the highest-scoring merged piece first", () => {
  expect(bpeMerges(tiny)).toEqual([
    ["a", "b"],
    ["▁", "ab"],
    ["▁a", "b"],
    ["▁", "a"],
  ]);
});

test("the dummy prefix is prepended to the whole text, and <n> stands for a newline both ways", () => {
  const { json, newlines } = tokenizerJsonFromSentencePiece(tiny, "m");
  expect(newlines).toBe(true);
  expect(json.normalizer).toEqual({
    type: "Sequence",
    normalizers: [
      { type: "Replace", pattern: { String: "\n" }, content: "<n>" },
      { type: "Prepend", prepend: "▁" },
      { type: "Replace", pattern: { String: " " }, content: "▁" },
    ],
  });
  expect(json.pre_tokenizer).toEqual({ type: "Split", pattern: { String: "<n>" }, behavior: "Isolated", invert: false });
  expect((json.decoder as { decoders: unknown[] }).decoders[0]).toEqual({ type: "Replace", pattern: { String: "<n>" }, content: "\n" });
  expect(json.model).toMatchObject({ type: "BPE", byte_fallback: true, ignore_merges: true, merges: ["a b", "▁ ab", "▁a b", "▁ a"] });
});

test("control pieces are special tokens, and every sequence starts with EOS (fuji adds no BOS)", () => {
  const { json } = tokenizerJsonFromSentencePiece(tiny, "m");
  expect((json.added_tokens as { content: string; special: boolean }[]).map((t) => [t.content, t.special])).toEqual([
    ["<pad>", true],
    ["</s>", true],
  ]);
  expect(json.post_processor).toMatchObject({
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: "</s>" } }, { Sequence: { id: "A" } }],
  });
});

test.each([
  [{ modelType: "unigram" as const }, /trainer_spec.model_type is UNIGRAM/],
  [{ treatWhitespaceAsSuffix: true }, /trainer_spec.treat_whitespace_as_suffix is true/],
])("a sentencepiece model it does not reproduce is refused naming the field (%o)", (over, message) => {
  expect(() => tokenizerJsonFromSentencePiece(model([["a", 0, "normal"]], over), "their.model")).toThrow(UsageError);
  expect(() => tokenizerJsonFromSentencePiece(model([["a", 0, "normal"]], over), "their.model")).toThrow(message);
});

describe("a tokenizer.json given", () => {
  const llama3 = {
    model: { type: "BPE", vocab: { a: 0, b: 1 } },
    added_tokens: [
      { id: 128000, content: "<|begin_of_text|>" },
      { id: 128001, content: "<|end_of_text|>" },
      { id: 128004, content: "<|finetune_right_pad_id|>" },
    ],
    post_processor: { type: "TemplateProcessing", single: "<|begin_of_text|> $A" },
  };
  const bytes = new TextEncoder().encode(JSON.stringify(llama3));

  test("takes AXLearn's FujiV3Vocabulary ids (EOS <|end_of_text|>, padding <|finetune_right_pad_id|>) and starts with EOS", () => {
    const t = fromTokenizerJson(bytes, "tokenizer.json", { embeddingRows: 128256 });
    expect(t.ids).toEqual({ bos: 128001, eos: 128001, pad: 128004 });
    const written = JSON.parse(new TextDecoder().decode(t.files(8192)[0]?.bytes));
    expect(written.post_processor.single[0]).toEqual({ SpecialToken: { id: "<|end_of_text|>", type_id: 0 } });
    expect(written.model).toEqual(llama3.model);
    expect(JSON.parse(new TextDecoder().decode(t.files(8192)[1]?.bytes))).toMatchObject({
      eos_token: "<|end_of_text|>",
      model_max_length: 8192,
    });
  });

  test("with more tokens than the model has embedding rows is refused: not this model's tokenizer", () => {
    expect(() => fromTokenizerJson(bytes, "tokenizer.json", { embeddingRows: 32768 })).toThrow(
      /128005 tokens, more than the model's 32768 embedding rows/,
    );
  });

  test("that names no end-of-sequence token is refused", () => {
    const none = new TextEncoder().encode(JSON.stringify({ model: { vocab: { a: 0 } } }));
    expect(() => fromTokenizerJson(none, "t.json", { embeddingRows: 10 })).toThrow(/names no end-of-sequence token/);
  });
});

describe("which tokenizer an export gets", () => {
  test("fuji's 32k and 128k embeddings get AXLearn's sentencepiece vocabularies", async () => {
    expect((await chooseTokenizer(undefined, 32768)).line).toMatch(
      /^tokenizer.json from AXLearn's bpe_32k_c4.model \(fuji v1\/v2\), newlines as <n>; bos\/eos 1, pad 0$/,
    );
    expect((await chooseTokenizer(undefined, 131072)).line).toMatch(/bpe_128k_c4.model \(fuji v3\)/);
  });

  test("fuji v3-tiktoken's 128256 rows need Llama 3's tokenizer.json, and carry fuji.py's ids without it", async () => {
    const c = await chooseTokenizer(undefined, 128256);
    expect(c.tokenizer).toBeUndefined();
    expect(c.line).toMatch(/^none: fuji v3-tiktoken uses Llama 3's tokenizer.json .*; add one with --tokenizer FILE/);
    expect(c.ids).toEqual({ bos: 128001, eos: 128001, pad: 128004 });
  });

  test("a vocabulary of no fuji tokenizer gets none, saying how to add one", async () => {
    expect((await chooseTokenizer(undefined, 8192)).line).toMatch(
      /^none: a vocabulary of 8192 is no fuji tokenizer's; add one with --tokenizer FILE/,
    );
  });

  test("--tokenizer none writes none; a missing file is refused naming it", async () => {
    expect((await chooseTokenizer("none", 32768)).tokenizer).toBeUndefined();
    await expect(chooseTokenizer({ file: "no/such/tokenizer.model" }, 32768)).rejects.toThrow(/no\/such\/tokenizer.model: no such file/);
  });

  test("--tokenizer FILE takes a sentencepiece model by its bytes, whatever its name", async () => {
    const c = await chooseTokenizer({ file: shippedTokenizer("bpe_32k_c4.model") }, 32768);
    expect(c.tokenizer?.files(4096).map((f) => f.name)).toEqual(["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]);
  });

  test("a tokenizer's names are its files' names, in their order, without making the files", async () => {
    const c = await chooseTokenizer({ file: shippedTokenizer("bpe_32k_c4.model") }, 32768);
    expect(c.tokenizer?.names).toEqual(c.tokenizer?.files(4096).map((f) => f.name));
  });

  test("--tokenizer takes a gs:// file", async () => {
    const bucket = await newBucket("tok");
    await emulatorStorage()
      .bucket(bucket)
      .file("vocab/spm.model")
      .save(readFileSync(shippedTokenizer("bpe_32k_c4.model")));
    const c = await chooseTokenizer({ file: `gs://${bucket}/vocab/spm.model` }, 32768);
    expect(c.line).toMatch(/^tokenizer.json from spm.model, newlines as <n>; bos\/eos 1, pad 0$/);
  });
});
