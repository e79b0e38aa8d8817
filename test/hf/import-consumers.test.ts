// An import from Hugging Face, proven against its real consumers: small random Llama models made and saved (sharded)
// by `transformers` (test/python/make_llama.py, with transformers' own logits for fixed tokens) are imported by the
// CLI, then restored into a fine-tuning trainer of the real `fuji.model_config(...)` by AXLearn's own state builder
// and run (test/python/axlearn_import_check.py). The Python route a team writes today (bench/python_import_route.py)
// goes through the same check first: it proves the harness. Needs the HF venv and AXLearn; skips saying which is
// absent.
import { existsSync, mkdirSync, symlinkSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { axlearnUnavailable, removeScratch, scratch } from "../helpers/convert.js";
import { AXLEARN_PYTHON, HF_PYTHON } from "../helpers/paths.js";
import { type RunResult, run } from "../helpers/run.js";

afterAll(removeScratch);

const VARIANTS = ["mha-tied", "gqa-untied"] as const;
type Variant = (typeof VARIANTS)[number];
type Route = "import-hf" | "python";

/** axlearn_import_check.py's summary of one case (the fields the tests read). */
interface ImportCheck {
  name: string;
  problems: string[];
  fuji_model_config: Record<string, unknown>;
  model_arrays: number;
  same_as_equal?: number;
  f32_max_abs_diff?: number;
  f32_tolerance?: number;
  greedy_positions: number;
  greedy_equal: number;
}

/** hf_same_tensors.py's summary: two folders' tensors compared by name, dtype, shape and bytes. */
interface SameTensors {
  tensors: number;
  equal: number;
  differences: string[];
}

const unavailable =
  axlearnUnavailable() ??
  (existsSync(HF_PYTHON) ? undefined : `no ${HF_PYTHON}: run scripts/install.sh (torch, transformers, safetensors)`);
const skipName = unavailable === undefined ? "" : ` (skipped: ${unavailable})`;

async function must(what: string, r: Promise<RunResult>): Promise<RunResult> {
  const done = await r;
  if (done.code !== 0) throw new Error(`${what} exited ${done.code}:\n${done.stderr.slice(-3000)}`);
  return done;
}

function cli(args: string[]): Promise<RunResult> {
  return run(process.execPath, ["bin/orbax2reg.js", ...args]);
}

/** A folder holding only the HF venv's `safetensors` package: what the Python route needs beside AXLearn's venv. */
async function safetensorsPath(root: string): Promise<string> {
  const r = await must(
    "locating safetensors",
    run(HF_PYTHON, ["-c", "import os, safetensors; print(os.path.dirname(safetensors.__file__))"]),
  );
  const dir = join(root, "pythonpath");
  mkdirSync(dir, { recursive: true });
  symlinkSync(r.stdout.trim(), join(dir, "safetensors"));
  return dir;
}

describe(`an import of Llama models saved by transformers, restored into a fuji trainer by AXLearn${skipName}`, () => {
  const root = scratch("import-consumers");
  const fixture = (v: Variant) => resolve(root, "fixtures", v);
  const step = (route: Route, v: Variant, dtype: string) => resolve(root, route, `${v}-${dtype}`, "step_00000000");
  const checks = new Map<string, ImportCheck>();
  const roundTrips = new Map<string, SameTensors>();
  const check = (route: Route, v: Variant, compute: string) => checks.get(`${route} ${v} ${compute}`) as ImportCheck;

  beforeAll(async () => {
    if (unavailable !== undefined) return;
    await must("make_llama.py", run(HF_PYTHON, ["test/python/make_llama.py", join(root, "fixtures")]));
    const pythonpath = await safetensorsPath(root);
    const cases = [];
    for (const v of VARIANTS) {
      // float32 from the float32 save (the default dtype), bfloat16 from the bfloat16 save.
      for (const [source, dtype] of [
        ["hf", "float32"],
        ["hf-bf16", "bfloat16"],
      ] as const) {
        const src = join(fixture(v), source);
        await must(
          `import-hf ${v} ${dtype}`,
          cli(["import-hf", src, join(root, "import-hf", `${v}-${dtype}`), "--dtype", dtype, "--no-progress"]),
        );
        cases.push({
          name: `import-hf ${v} ${dtype}`,
          step_dir: step("import-hf", v, dtype),
          source: src,
          fixture: fixture(v),
          compute: dtype,
          // The float32 import against the Python route's, array by array (both mappings written independently).
          ...(dtype === "float32" ? { same_as: step("python", v, "float32") } : {}),
        });
      }
      await must(
        `python_import_route.py ${v}`,
        run(AXLEARN_PYTHON, ["bench/python_import_route.py", join(fixture(v), "hf"), join(root, "python", `${v}-float32`)], {
          env: { ...process.env, PYTHONPATH: pythonpath },
        }),
      );
      cases.push({
        name: `python ${v} float32`,
        step_dir: step("python", v, "float32"),
        source: join(fixture(v), "hf"),
        fixture: fixture(v),
        compute: "float32",
      });
    }
    // Back again: export-hf of each import, in its dtype, without a tokenizer (these models have none).
    for (const v of VARIANTS) {
      for (const [source, dtype] of [
        ["hf", "float32"],
        ["hf-bf16", "bfloat16"],
      ] as const) {
        const back = join(root, "back", `${v}-${dtype}`);
        await must(
          `export-hf ${v} ${dtype}`,
          cli(["export-hf", step("import-hf", v, dtype), back, "--dtype", dtype, "--tokenizer", "none", "--no-progress"]),
        );
        const r = await must(
          `hf_same_tensors.py ${v} ${dtype}`,
          run(HF_PYTHON, ["test/python/hf_same_tensors.py", back, join(fixture(v), source)]),
        );
        roundTrips.set(`${v} ${dtype}`, JSON.parse(r.stdout.trim().split("\n").pop() as string) as SameTensors);
      }
    }
    const file = join(root, "cases.json");
    writeFileSync(file, JSON.stringify(cases));
    const r = await must("axlearn_import_check.py", run(AXLEARN_PYTHON, ["test/python/axlearn_import_check.py", file]));
    for (const line of r.stdout.split("\n").filter((l) => l.startsWith("{"))) {
      const c = JSON.parse(line) as ImportCheck;
      checks.set(c.name, c);
    }
  }, 900_000);

  test.for(VARIANTS)(
    "%s: the Python route a team writes today restores and matches transformers' float32 logits (the harness holds)",
    (v, ctx) => {
      if (unavailable !== undefined) ctx.skip();
      const c = check("python", v, "float32");
      expect(c.problems).toEqual([]);
      expect(c.f32_max_abs_diff).toBeLessThanOrEqual(c.f32_tolerance as number);
    },
  );

  test.for([
    ["mha-tied", "as many KV heads as heads (FusedQKVLinear), lm_head tied to the embedding"],
    ["gqa-untied", "fewer KV heads (FusedGroupedQKVLinear with num_kv_heads), a separate lm_head"],
  ] as const)("%s, %s: restored into fuji.model_config's trainer, float32 logits match transformers' to float32 rounding", ([v], ctx) => {
    if (unavailable !== undefined) ctx.skip();
    const c = check("import-hf", v, "float32");
    expect(c.problems).toEqual([]);
    expect(c.f32_max_abs_diff).toBeLessThanOrEqual(c.f32_tolerance as number);
    expect(c.greedy_equal).toBe(c.greedy_positions);
    expect(c.model_arrays).toBe(v === "mha-tied" ? 9 : 10);
  });

  test.for(VARIANTS)(
    "%s: the float32 import holds the Python route's arrays byte for byte (two mappings written independently agree)",
    (v, ctx) => {
      if (unavailable !== undefined) ctx.skip();
      const c = check("import-hf", v, "float32");
      expect(c.problems).toEqual([]);
      expect(c.same_as_equal).toBe(c.model_arrays);
    },
  );

  test.for(VARIANTS)(
    "%s: the bfloat16 save imported in bfloat16 and run in bfloat16 picks transformers' greedy token at every position",
    (v, ctx) => {
      if (unavailable !== undefined) ctx.skip();
      const c = check("import-hf", v, "bfloat16");
      expect(c.problems).toEqual([]);
      expect(c.greedy_equal).toBe(c.greedy_positions);
    },
  );

  test.for([
    ["mha-tied", "float32"],
    ["gqa-untied", "float32"],
    ["mha-tied", "bfloat16"],
    ["gqa-untied", "bfloat16"],
  ] as const)("%s, %s: export-hf of the import gives back the source's tensors byte for byte", ([v, dtype], ctx) => {
    if (unavailable !== undefined) ctx.skip();
    const same = roundTrips.get(`${v} ${dtype}`) as SameTensors;
    expect(same.differences).toEqual([]);
    expect(same.equal).toBe(same.tensors);
    expect(same.tensors).toBe(v === "mha-tied" ? 2 + 9 * 2 : 3 + 9 * 3);
  });
});
