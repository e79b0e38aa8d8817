// Test helpers for the Hugging Face export: small fuji-shaped trees (in memory, or written as a regular step),
// and the expected HF tensors computed the plain way, element by element, from whole source arrays.
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { compress } from "../../src/codecs/zstd.js";
import type { SourceArray } from "../../src/hf/source.js";
import { arrayEntry, indexText } from "../../src/regular/index-file.js";
import { zarrayText } from "../../src/regular/zarray.js";
import { DTYPES } from "../../src/zarr/dtype.js";
import { chunkGrid, parseZarrMetadata, product } from "../../src/zarr/metadata.js";

export const F32 = DTYPES.find((d) => d.name === "float32");

export interface Dims {
  layers: number;
  dim: number;
  heads: number;
  kvHeads?: number;
  headDim: number;
  ffn: number;
  vocab: number;
  lmHead?: boolean;
}

export interface HostArray {
  path: string;
  shape: number[];
  data: Float32Array;
}

const L = "model/decoder/transformer/repeat/layer";

/** A fuji tree's model/ arrays (fused QKV unless kvHeads is given), filled with distinct values. */
export function fujiArrays(d: Dims, seed = 1): HostArray[] {
  const qkv = d.kvHeads === undefined ? [d.layers, 3, d.dim, d.heads, d.headDim] : [d.layers, d.dim, d.heads + 2 * d.kvHeads, d.headDim];
  const shapes: [string, number[]][] = [
    ["model/decoder/emb/token_emb/weight", [d.vocab, d.dim]],
    ["model/decoder/output_norm/scale", [d.dim]],
    [`${L}/self_attention/norm/scale`, [d.layers, d.dim]],
    [`${L}/self_attention/attention/i_proj/i_proj/qkv_proj/weight`, qkv],
    [`${L}/self_attention/attention/o_proj/weight`, [d.layers, d.dim, d.heads, d.headDim]],
    [`${L}/feed_forward/norm/scale`, [d.layers, d.dim]],
    [`${L}/feed_forward/linear1_0/weight`, [d.layers, d.dim, d.ffn]],
    [`${L}/feed_forward/linear1_1/weight`, [d.layers, d.dim, d.ffn]],
    [`${L}/feed_forward/linear2/weight`, [d.layers, d.ffn, d.dim]],
  ];
  if (d.lmHead) shapes.push(["model/decoder/lm_head/weight", [d.vocab, d.dim]]);
  let s = seed;
  return shapes.map(([path, shape]) => {
    const data = new Float32Array(product(shape));
    // A small LCG: reproducible, every value different enough to catch a misplaced element.
    for (let i = 0; i < data.length; i++) {
      s = (Math.imul(s, 1103515245) + 12345) >>> 0;
      data[i] = (s / 2 ** 32 - 0.5) * 0.1;
    }
    return { path, shape, data };
  });
}

/** The chunk of `a` at grid `index` (chunk shape `chunks`, edge chunks padded with zeros), as bytes. */
export function chunkOf(a: HostArray, chunks: readonly number[], index: readonly number[]): Uint8Array {
  const out = new Float32Array(product(chunks));
  const r = a.shape.length;
  const at = new Array<number>(r).fill(0);
  for (let i = 0; i < out.length; i++) {
    let rem = i;
    for (let d = r - 1; d >= 0; d--) {
      at[d] = rem % (chunks[d] as number);
      rem = Math.floor(rem / (chunks[d] as number));
    }
    let src = 0;
    let inside = true;
    for (let d = 0; d < r; d++) {
      const c = (index[d] as number) * (chunks[d] as number) + (at[d] as number);
      if (c >= (a.shape[d] as number)) inside = false;
      src = src * (a.shape[d] as number) + c;
    }
    if (inside) out[i] = a.data[src] as number;
  }
  return new Uint8Array(out.buffer);
}

/** An in-memory SourceArray whose chunks stream in pieces of `piece` bytes (odd sizes test the element carry). */
export function memoryArray(a: HostArray, chunks: readonly number[], piece = 4099): SourceArray {
  const meta = parseZarrMetadata(
    ".zarray",
    new TextEncoder().encode(zarrayText({ shape: a.shape, chunkShape: [...chunks], dtype: F32 as never })),
    { path: a.path },
  );
  return {
    path: a.path,
    meta,
    describeChunk: (index) => `${a.path}/${index.join(".")}`,
    chunk: (index) =>
      (async function* () {
        const bytes = chunkOf(a, chunks, index);
        for (let at = 0; at < bytes.length; at += piece) yield bytes.slice(at, at + piece);
      })(),
  };
}

/** Chunks splitting axis `axis` in `parts` (as an fsdp mesh shards a weight), the rest whole. */
export function shardedChunks(shape: readonly number[], axis: number, parts: number): number[] {
  return shape.map((s, d) => (d === axis ? Math.ceil(s / parts) : s));
}

/** Writes `arrays` as a regular step (index + gda/<path>/.zarray + zstd chunks) under `dir`. */
export function writeRegularStep(dir: string, arrays: readonly HostArray[], chunksOf: (a: HostArray) => number[], step = 7): void {
  mkdirSync(dir, { recursive: true });
  for (const a of arrays) {
    const chunks = chunksOf(a);
    const base = join(dir, "gda", a.path);
    mkdirSync(base, { recursive: true });
    writeFileSync(join(base, ".zarray"), zarrayText({ shape: a.shape, chunkShape: chunks, dtype: F32 as never }));
    const grid = chunkGrid({ shape: a.shape, chunkShape: chunks });
    for (let i = 0; i < product(grid); i++) {
      const index: number[] = [];
      let rem = i;
      for (let d = grid.length - 1; d >= 0; d--) {
        index[d] = rem % (grid[d] as number);
        rem = Math.floor(rem / (grid[d] as number));
      }
      writeFileSync(join(base, index.join(".")), compress(chunkOf(a, chunks, index)));
    }
  }
  writeFileSync(
    join(dir, "index"),
    indexText(
      step,
      arrays.map((a) => arrayEntry(a.path, "float32", a.shape)),
    ),
  );
}

/**
 * The HF tensors of a fuji tree in float32, computed the plain way from the definitions: HF weights are
 * [out, in]; q/k rows of a head in HF's rotate-half order: HF row r < hd/2 is AXLearn's 2r, row hd/2 + r is
 * AXLearn's 2r + 1.
 */
export function expectedTensors(arrays: readonly HostArray[], d: Dims): Map<string, { shape: number[]; data: Float32Array }> {
  const get = (suffix: string) => arrays.find((a) => a.path.endsWith(suffix)) as HostArray;
  const out = new Map<string, { shape: number[]; data: Float32Array }>();
  const K = d.kvHeads ?? d.heads;
  const hd = d.headDim;
  const axRow = (r: number) => (r < hd / 2 ? 2 * r : 2 * (r - hd / 2) + 1);
  out.set("model.embed_tokens.weight", { shape: [d.vocab, d.dim], data: get("emb/token_emb/weight").data });
  const qkv = get("qkv_proj/weight");
  const per = (a: HostArray) => product(a.shape.slice(1));
  for (let l = 0; l < d.layers; l++) {
    const p = `model.layers.${l}.`;
    const proj = (which: 0 | 1 | 2, heads: number, rotary: boolean) => {
      const data = new Float32Array(heads * hd * d.dim);
      for (let h = 0; h < heads; h++)
        for (let r = 0; r < hd; r++)
          for (let i = 0; i < d.dim; i++) {
            const x = rotary ? axRow(r) : r;
            let v: number;
            if (d.kvHeads === undefined) v = qkv.data[l * per(qkv) + ((which * d.dim + i) * d.heads + h) * hd + x] as number;
            else {
              const n = which === 0 ? h : which === 1 ? d.heads + h : d.heads + K + h;
              v = qkv.data[l * per(qkv) + (i * (d.heads + 2 * K) + n) * hd + x] as number;
            }
            data[(h * hd + r) * d.dim + i] = v;
          }
      return { shape: [heads * hd, d.dim], data };
    };
    out.set(`${p}self_attn.q_proj.weight`, proj(0, d.heads, true));
    out.set(`${p}self_attn.k_proj.weight`, proj(1, K, true));
    out.set(`${p}self_attn.v_proj.weight`, proj(2, K, false));
    const o = get("o_proj/weight");
    out.set(`${p}self_attn.o_proj.weight`, { shape: [d.dim, d.heads * hd], data: o.data.slice(l * per(o), (l + 1) * per(o)) });
    const t = (a: HostArray, rows: number, cols: number) => {
      const data = new Float32Array(rows * cols);
      for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) data[j * rows + i] = a.data[l * per(a) + i * cols + j] as number;
      return { shape: [cols, rows], data };
    };
    out.set(`${p}mlp.gate_proj.weight`, t(get("linear1_0/weight"), d.dim, d.ffn));
    out.set(`${p}mlp.up_proj.weight`, t(get("linear1_1/weight"), d.dim, d.ffn));
    out.set(`${p}mlp.down_proj.weight`, t(get("linear2/weight"), d.ffn, d.dim));
    const n1 = get("self_attention/norm/scale");
    const n2 = get("feed_forward/norm/scale");
    out.set(`${p}input_layernorm.weight`, { shape: [d.dim], data: n1.data.slice(l * d.dim, (l + 1) * d.dim) });
    out.set(`${p}post_attention_layernorm.weight`, { shape: [d.dim], data: n2.data.slice(l * d.dim, (l + 1) * d.dim) });
  }
  out.set("model.norm.weight", { shape: [d.dim], data: get("output_norm/scale").data });
  if (d.lmHead) out.set("lm_head.weight", { shape: [d.vocab, d.dim], data: get("lm_head/weight").data });
  return out;
}
