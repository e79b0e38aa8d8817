// import-hf refuses, before writing anything, what a fuji model cannot represent or a checkpoint that does not
// hold what its config.json says: one line naming it, exit 2, no destination made.
import { existsSync, readFileSync, unlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { exportHf } from "../../src/hf/export.js";
import { parseHeader } from "../../src/hf/safetensors.js";
import { runCli } from "../helpers/cli.js";
import { tempDir } from "../helpers/tmp.js";
import { type Dims, fujiArrays, writeRegularStep } from "./fuji-tree.js";

const DIMS: Dims = { layers: 2, dim: 16, heads: 2, kvHeads: 1, headDim: 8, ffn: 24, vocab: 12, lmHead: true };

interface Tensor {
  name: string;
  dtype: string;
  shape: number[];
  bytes: Uint8Array;
}

/** A Llama folder (export-hf of a fuji tree, float32, one file) and its tensors, to change and write back. */
async function llamaFolder(): Promise<{ dir: string; config: Record<string, unknown>; tensors: Tensor[] }> {
  const root = tempDir("imprefuse");
  writeRegularStep(join(root, "fuji"), fujiArrays(DIMS, 4), (a) => [...a.shape]);
  const dir = join(root, "hf");
  await exportHf(join(root, "fuji"), dir, { dtype: "float32", memoryBytes: 64 * 2 ** 20, tokenizer: "none" });
  // export-hf names its one shard model-00001-of-00001.safetensors, with an index; written back as model.safetensors.
  const shard = join(dir, "model-00001-of-00001.safetensors");
  const data = readFileSync(shard);
  unlinkSync(shard);
  const h = parseHeader(data, shard);
  const tensors = h.tensors.map((t) => ({
    name: t.name,
    dtype: t.dtype as string,
    shape: [...t.shape],
    bytes: data.subarray(h.dataStart + t.begin, h.dataStart + t.end),
  }));
  return { dir, config: JSON.parse(readFileSync(join(dir, "config.json"), "utf8")), tensors };
}

/** Writes `tensors` as the folder's one safetensors file (any dtype string) and `config` as its config.json. */
function write(dir: string, config: Record<string, unknown>, tensors: readonly Tensor[]): void {
  const header: Record<string, unknown> = { __metadata__: { format: "pt" } };
  let at = 0;
  for (const t of tensors) {
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [at, at + t.bytes.length] };
    at += t.bytes.length;
  }
  const json = Buffer.from(JSON.stringify(header));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  writeFileSync(join(dir, "model.safetensors"), Buffer.concat([len, json, ...tensors.map((t) => t.bytes)]));
  if (existsSync(join(dir, "model.safetensors.index.json"))) unlinkSync(join(dir, "model.safetensors.index.json"));
  writeFileSync(join(dir, "config.json"), JSON.stringify(config));
}

/** Imports the changed folder through the CLI: the refusal's exit code and line, and whether anything was written. */
async function refused(change: (f: { config: Record<string, unknown>; tensors: Tensor[] }) => void) {
  const f = await llamaFolder();
  change(f);
  write(f.dir, f.config, f.tensors);
  const dest = join(f.dir, "..", "ckpt");
  const r = await runCli(["import-hf", f.dir, dest, "--no-progress"]);
  expect(r.stdout).toBe("");
  expect(r.stderr.trim().split("\n")).toHaveLength(1);
  expect(existsSync(dest)).toBe(false);
  return r;
}

describe("import-hf refuses what fuji cannot represent, before writing anything", () => {
  test("the folder unchanged imports (the baseline of every refusal below)", async () => {
    const f = await llamaFolder();
    write(f.dir, f.config, f.tensors);
    const r = await runCli(["import-hf", f.dir, join(f.dir, "..", "ckpt"), "--no-progress"]);
    expect(r.code, r.stderr).toBe(0);
  });

  test("attention_bias", async () => {
    const r = await refused((f) => {
      f.config.attention_bias = true;
    });
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/attention_bias: true: fuji's attention has no biases/);
  });

  test("mlp_bias", async () => {
    const r = await refused((f) => {
      f.config.mlp_bias = true;
    });
    expect(r.stderr).toMatch(/mlp_bias: true/);
  });

  test("a bias tensor, whatever config.json says", async () => {
    const r = await refused((f) => {
      f.tensors.push({ name: "model.layers.0.self_attn.q_proj.bias", dtype: "F32", shape: [16], bytes: new Uint8Array(64) });
    });
    expect(r.stderr).toMatch(/tensor model\.layers\.0\.self_attn\.q_proj\.bias: fuji's layers have no biases/);
  });

  test("rope_scaling (transformers 4: Llama 3.1's llama3)", async () => {
    const r = await refused((f) => {
      f.config.rope_scaling = { rope_type: "llama3", factor: 8.0 };
    });
    expect(r.stderr).toMatch(/rope_scaling: "llama3": fuji's rotary embeddings have no scaling/);
  });

  test("a scaled rope_parameters (transformers 5)", async () => {
    const r = await refused((f) => {
      f.config.rope_parameters = { rope_type: "llama3", rope_theta: 5e5, factor: 8.0 };
    });
    expect(r.stderr).toMatch(/rope_parameters\.rope_type: "llama3"/);
  });

  test("a head_dim other than hidden_size / num_attention_heads", async () => {
    const r = await refused((f) => {
      f.config.head_dim = 16;
    });
    expect(r.stderr).toMatch(/head_dim: 16 differs from hidden_size \/ num_attention_heads = 8/);
  });

  test("an activation other than SiLU", async () => {
    const r = await refused((f) => {
      f.config.hidden_act = "gelu";
    });
    expect(r.stderr).toMatch(/hidden_act: "gelu": fuji's feed-forward is SwiGLU/);
  });

  test("a dtype other than F32, BF16, F16", async () => {
    const r = await refused((f) => {
      const t = f.tensors.find((x) => x.name === "model.norm.weight") as Tensor;
      t.dtype = "F64";
      t.bytes = new Uint8Array(t.bytes.length * 2);
    });
    expect(r.stderr).toMatch(/tensor "model\.norm\.weight" has dtype F64 \(F32, BF16, F16 expected\)/);
  });

  test("a tensor missing", async () => {
    const r = await refused((f) => {
      f.tensors = f.tensors.filter((t) => t.name !== "model.layers.1.mlp.up_proj.weight");
    });
    expect(r.stderr).toMatch(/1 tensor\(s\) missing, first model\.layers\.1\.mlp\.up_proj\.weight/);
  });

  test("a tensor more than config.json's dims have", async () => {
    const r = await refused((f) => {
      f.tensors.push({ name: "model.layers.2.input_layernorm.weight", dtype: "F32", shape: [16], bytes: new Uint8Array(64) });
    });
    expect(r.stderr).toMatch(
      /1 tensor\(s\) a fuji Llama of config\.json's dims does not have, first model\.layers\.2\.input_layernorm\.weight/,
    );
  });

  test("lm_head.weight beside tie_word_embeddings", async () => {
    const r = await refused((f) => {
      f.config.tie_word_embeddings = true;
    });
    expect(r.stderr).toMatch(/first lm_head\.weight \(config\.json says tie_word_embeddings/);
  });

  test("a shape config.json's dims do not give", async () => {
    const r = await refused((f) => {
      f.config.intermediate_size = 32;
    });
    expect(r.stderr).toMatch(
      /tensor model\.layers\.0\.mlp\.gate_proj\.weight has shape \[24, 16\], config\.json's dims make it \[32, 16\]/,
    );
  });

  test("a model type other than llama", async () => {
    const r = await refused((f) => {
      f.config.model_type = "mistral";
    });
    expect(r.stderr).toMatch(/model_type: "mistral" is not "llama"/);
  });
});
