// An export's tokenizer against its real consumers: transformers' AutoTokenizer over the files export-hf writes
// gives the ids of the `sentencepiece` package over AXLearn's own vocabulary (what seqio's SentencePieceVocabulary
// wraps) on a varied corpus, on every piece and on random strings, and decodes as it does; the export alone loads
// in AutoTokenizer, AutoModelForCausalLM and pipeline("text-generation"), and generate stops at AXLearn's end of
// sequence. Needs .venv-hf (with sentencepiece); skips saying so.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { chooseTokenizer, shippedTokenizer } from "../../src/hf/vocabularies.js";
import { runCli } from "../helpers/cli.js";
import { HF_PYTHON } from "../helpers/paths.js";
import { tempDir } from "../helpers/tmp.js";
import { fujiArrays, writeRegularStep } from "./fuji-tree.js";

const unavailable = !existsSync(HF_PYTHON)
  ? `no ${HF_PYTHON}: run scripts/install.sh (transformers, sentencepiece)`
  : spawnSync(HF_PYTHON, ["-c", "import sentencepiece, transformers"]).status !== 0
    ? `${HF_PYTHON} lacks sentencepiece or transformers: run scripts/install.sh`
    : undefined;
if (unavailable !== undefined) console.warn(`tokenizer consumers: skipped: ${unavailable}`);

function python(args: string[]): Record<string, unknown> {
  const r = spawnSync(HF_PYTHON, ["test/python/tokenizer_check.py", ...args], { encoding: "utf8", maxBuffer: 1 << 26 });
  if (r.status !== 0) throw new Error(`tokenizer_check.py ${args[0]} failed: ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split("\n").at(-1) as string);
}

const DIMS = { layers: 2, dim: 8, heads: 2, headDim: 4, ffn: 16, vocab: 32768, lmHead: true };

/**
 * A fuji v2-shaped step (32k vocabulary) whose greedy next token is always EOS (1): every embedding row is ones,
 * the layers add nothing (o_proj and linear2 zero), the norms are ones, and the head's only non-zero row is 1's.
 */
function eosModel(dir: string): void {
  const arrays = fujiArrays(DIMS).map((a) => {
    const data = new Float32Array(a.data.length);
    if (a.path.endsWith("token_emb/weight") || a.path.endsWith("/scale")) data.fill(1);
    else if (a.path.endsWith("lm_head/weight")) data.fill(1, DIMS.dim, 2 * DIMS.dim);
    else if (!a.path.includes("o_proj") && !a.path.includes("linear2")) data.set(a.data.map((v) => v * 1e-3));
    return { ...a, data };
  });
  writeRegularStep(dir, arrays, (a) => a.shape);
}

describe.skipIf(unavailable !== undefined)("the export's tokenizer in transformers", () => {
  let exported: string;
  let stdout: string;

  beforeAll(async () => {
    const root = tempDir("hf-tokenizer");
    eosModel(join(root, "step"));
    exported = join(root, "hf");
    const r = await runCli(["export-hf", join(root, "step"), exported, "--no-progress"]);
    if (r.code !== 0) throw new Error(r.stderr);
    stdout = r.stdout;
  }, 120_000);

  test("a fuji 32k export says which tokenizer it wrote and the ids it carries", () => {
    expect(stdout).toMatch(
      /^tokenizer: tokenizer.json from AXLearn's bpe_32k_c4.model \(fuji v1\/v2\), newlines as <n>; bos\/eos 1, pad 0$/m,
    );
  });

  test("AutoTokenizer over the export gives AXLearn's ids: corpus, every piece, random strings; decoding as sentencepiece", () => {
    const r = python(["ids", exported, shippedTokenizer("bpe_32k_c4.model")]);
    expect(r).toMatchObject({ corpus_diffs: [], decode_diffs: [], pieces_differing: 0, fuzz_differing: 0 });
    expect(r.pieces).toBeGreaterThan(31_000);
    // Every sequence starts with EOS, as fuji's documents do; the special ids are AXLearn's.
    expect(r.with_special).toEqual([1, 17782]);
    expect(r.special).toEqual({ bos: 1, eos: 1, pad: 0 });
    expect(r.model_max_length).toBe(4096);
  }, 120_000);

  test("the export alone loads in pipeline('text-generation'), and generate stops at AXLearn's end of sequence", () => {
    const r = python(["generate", exported]) as {
      prompt_ids: number[];
      stopped: number[];
      unstopped: number[];
      generation_config: Record<string, number>;
      pipeline: string;
    };
    expect(r.generation_config).toEqual({ bos: 1, eos: 1, pad: 0 });
    // EOS once, then stopped; told no end of sequence the same model runs on to max_new_tokens.
    expect(r.stopped).toEqual([...r.prompt_ids, 1]);
    expect(r.unstopped.length).toBe(r.prompt_ids.length + 12);
    expect(r.pipeline).toBe("Hello\nworld");
  }, 300_000);
});

describe.skipIf(unavailable !== undefined)("fuji v3's 128k vocabulary in transformers", () => {
  test("AutoTokenizer over the files made for a 131072-row embedding gives bpe_128k_c4's ids", async () => {
    const dir = join(tempDir("hf-tokenizer"), "v3");
    mkdirSync(dir, { recursive: true });
    const chosen = await chooseTokenizer(undefined, 131072);
    for (const f of chosen.tokenizer?.files(8192) ?? []) writeFileSync(join(dir, f.name), f.bytes);
    const r = python(["ids", dir, shippedTokenizer("bpe_128k_c4.model")]);
    expect(r).toMatchObject({ corpus_diffs: [], decode_diffs: [], pieces_differing: 0, fuzz_differing: 0, model_max_length: 8192 });
    expect(r.pieces).toBeGreaterThan(127_000);
  }, 300_000);
});
