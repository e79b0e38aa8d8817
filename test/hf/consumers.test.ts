// An export to Hugging Face, proven against its real consumers: small fuji-shaped LMs built from AXLearn's own
// layers and saved by its OrbaxCheckpointer (test/fixtures-gen/axlearn_fuji.py, with AXLearn's own logits for
// fixed tokens) are exported by the CLI in float32 and bfloat16, then read by the `safetensors` library and
// `transformers`' LlamaForCausalLM (test/python/hf_check.py). Needs AXLearn (ORBAX2REG_AXLEARN at setup) and the
// HF venv; skips saying which is absent.
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { axlearnUnavailable, removeScratch, scratch } from "../helpers/convert.js";
import { AXLEARN_FUJI_ROOT, AXLEARN_FUJI_VARIANTS, HF_PYTHON } from "../helpers/paths.js";
import { type RunResult, run } from "../helpers/run.js";

afterAll(removeScratch);

type Variant = (typeof AXLEARN_FUJI_VARIANTS)[number];
type Dtype = "float32" | "bfloat16";
const DTYPES: Dtype[] = ["float32", "bfloat16"];

/** hf_check.py's summary (the fields the tests read). */
interface HfCheck {
  variant: string;
  dtype: Dtype;
  problems: string[];
  by_check: Record<"files" | "config" | "load" | "logits" | "greedy", string[]>;
  shards: number;
  tensors: number;
  dtypes: string[];
  config: Record<string, unknown>;
  f32_max_abs_diff: number;
  f32_tolerance?: number;
  logits_max_abs: number;
  greedy_bf16_positions: number;
  greedy_bf16_equal: number;
}

const STEP = (v: Variant) => `${AXLEARN_FUJI_ROOT}/${v}/checkpoints/step_00001000`;
const unavailable =
  axlearnUnavailable() ??
  (existsSync(HF_PYTHON) ? undefined : `no ${HF_PYTHON}: run scripts/install.sh (torch, transformers, safetensors)`) ??
  (AXLEARN_FUJI_VARIANTS.every((v) => existsSync(STEP(v)))
    ? undefined
    : `no ${AXLEARN_FUJI_ROOT} (the global setup writes it with AXLearn)`);
const skipName = unavailable === undefined ? "" : ` (skipped: ${unavailable})`;

const expected = (v: Variant) => JSON.parse(readFileSync(`${AXLEARN_FUJI_ROOT}/${v}/expected.json`, "utf8"));

/** The real executable, asynchronously: an export and the Python checks take longer than a worker may block. */
function cli(args: string[]): Promise<RunResult> {
  return run(process.execPath, ["bin/orbax2reg.js", ...args]);
}

async function exportHf(source: string, dest: string, v: Variant, dtype: Dtype, extra: string[] = []): Promise<void> {
  const r = await cli(["export-hf", source, dest, "--dtype", dtype, "--fuji-version", expected(v).fuji_version, "--no-progress", ...extra]);
  if (r.code !== 0) throw new Error(`export-hf ${source} exited ${r.code}:\n${r.stderr.slice(-2000)}`);
}

async function hfCheck(dir: string, v: Variant, dtype: Dtype): Promise<HfCheck> {
  const r = await run(HF_PYTHON, ["test/python/hf_check.py", dir, `${AXLEARN_FUJI_ROOT}/${v}`, dtype]);
  const line = r.stdout.split("\n").find((l) => l.startsWith("{"));
  if (r.code !== 0 || line === undefined) throw new Error(`hf_check.py exited ${r.code}:\n${r.stderr.slice(-3000)}`);
  return JSON.parse(line) as HfCheck;
}

describe(`an export of fuji-shaped models built and saved by AXLearn, read by safetensors and transformers${skipName}`, () => {
  const root = scratch("hf-consumers");
  const dir = (v: Variant, dtype: Dtype) => join(root, `${v}-${dtype}`);
  const checks = new Map<string, HfCheck>();
  const check = (v: Variant, dtype: Dtype) => checks.get(`${v}-${dtype}`) as HfCheck;

  beforeAll(async () => {
    if (unavailable !== undefined) return;
    const cases = AXLEARN_FUJI_VARIANTS.flatMap((v) => DTYPES.map((dtype) => [v, dtype] as const));
    for (const [v, dtype] of cases) await exportHf(STEP(v), dir(v, dtype), v, dtype);
    // Two at a time: each loads torch and two models (about 5 s of one core).
    for (let i = 0; i < cases.length; i += 2) {
      const batch = cases.slice(i, i + 2);
      await Promise.all(
        batch.map(async ([v, dtype]) => {
          checks.set(`${v}-${dtype}`, await hfCheck(dir(v, dtype), v, dtype));
        }),
      );
    }
  }, 600_000);

  test("every shard parses with the safetensors library and holds exactly the index's tensors, in the export's dtype and LlamaForCausalLM's shapes", (ctx) => {
    if (unavailable !== undefined) ctx.skip();
    for (const v of AXLEARN_FUJI_VARIANTS) {
      const e = expected(v);
      for (const dtype of DTYPES) {
        const c = check(v, dtype);
        expect(c.by_check.files, `${v} ${dtype}`).toEqual([]);
        expect(c.tensors).toBe(2 + (e.shared_lm_head ? 0 : 1) + 9 * e.num_layers);
        expect(c.dtypes).toEqual([dtype === "float32" ? "F32" : "BF16"]);
      }
    }
  });

  test("split into many shards by --max-shard-size, it loads and computes the same logits", async (ctx) => {
    if (unavailable !== undefined) ctx.skip();
    const v = "grouped-untied";
    const sharded = join(root, `${v}-sharded`);
    // 200 kB: below the 1.4 MiB float32 model, above its largest tensor (the 147 kB embedding).
    await exportHf(STEP(v), sharded, v, "float32", ["--max-shard-size", "200KB"]);
    const c = await hfCheck(sharded, v, "float32");
    expect(c.problems).toEqual([]);
    expect(c.shards).toBeGreaterThan(2);
    expect(c.f32_max_abs_diff).toBe(check(v, "float32").f32_max_abs_diff);
  }, 120_000);

  test("transformers reads the config as the model's architecture and loads every weight (no missing or unexpected ones)", (ctx) => {
    if (unavailable !== undefined) ctx.skip();
    for (const v of AXLEARN_FUJI_VARIANTS) {
      const e = expected(v);
      const c = check(v, "float32");
      expect([...c.by_check.config, ...c.by_check.load], v).toEqual([]);
      expect(c.config).toMatchObject({
        num_hidden_layers: e.num_layers,
        hidden_size: e.hidden_dim,
        num_attention_heads: e.num_heads,
        num_key_value_heads: e.num_kv_heads,
        tie_word_embeddings: e.shared_lm_head,
        rope_theta: e.rope_theta,
        rms_norm_eps: 1e-5,
      });
    }
  });

  test.for([
    ["fused-tied", "fused QKV (v1/v2) with a tied head"],
    ["grouped-untied", "grouped QKV with num_kv_heads (v3) and a separate lm_head"],
    ["stacked-v1", "unstacked layers (StackedTransformerLayer's layer{i}/ subtrees), fused QKV, untied head"],
  ] as const)("%s, %s: float32 logits agree with AXLearn's own forward pass to float32 rounding", ([variant], ctx) => {
    if (unavailable !== undefined) ctx.skip();
    const c = check(variant, "float32");
    expect(c.by_check.logits).toEqual([]);
    expect(c.f32_max_abs_diff).toBeLessThanOrEqual(c.f32_tolerance as number);
  });

  test("a bfloat16 export run in bfloat16 picks AXLearn's greedy next token at every position", (ctx) => {
    if (unavailable !== undefined) ctx.skip();
    for (const v of AXLEARN_FUJI_VARIANTS) {
      const c = check(v, "bfloat16");
      expect(c.by_check.greedy, v).toEqual([]);
      expect(c.greedy_bf16_equal, v).toBe(c.greedy_bf16_positions);
    }
  });

  test("orbax2reg verify checks every export against its AXLearn source tensor by tensor and finds them equal", async (ctx) => {
    if (unavailable !== undefined) ctx.skip();
    for (const v of AXLEARN_FUJI_VARIANTS) {
      for (const dtype of DTYPES) {
        const r = await cli(["verify", STEP(v), dir(v, dtype)]);
        expect(r.code, `${v} ${dtype}: ${r.stdout.slice(-500)}${r.stderr.slice(-500)}`).toBe(0);
      }
    }
  }, 120_000);

  test("the same step converted to a regular step first exports to the same files", async (ctx) => {
    if (unavailable !== undefined) ctx.skip();
    for (const v of AXLEARN_FUJI_VARIANTS) {
      const regular = join(root, `${v}-regular`);
      const converted = await cli(["convert", STEP(v), regular, "--no-progress"]);
      expect(converted.code, converted.stderr).toBe(0);
      const again = join(root, `${v}-from-regular`);
      await exportHf(join(regular, "step_00001000"), again, v, "bfloat16");
      const direct = dir(v, "bfloat16");
      // What a consumer reads: everything but the exporter's own record (a dotfile naming its source).
      const hfFiles = (d: string) =>
        readdirSync(d)
          .filter((f) => f !== "config.json" && !f.startsWith("."))
          .sort();
      const files = hfFiles(direct);
      expect(hfFiles(again)).toEqual(files);
      for (const f of files) expect(readFileSync(join(again, f)).equals(readFileSync(join(direct, f))), `${v}: ${f}`).toBe(true);
      // Parsed: the same model however its keys are ordered.
      const config = (d: string) => JSON.parse(readFileSync(join(d, "config.json"), "utf8"));
      expect(config(again)).toEqual(config(direct));
    }
  }, 300_000);
});
