import { DEFAULT_IMPORT_MEMORY, type ImportDtype, type ImportResult, importHf } from "../hf/import.js";
import { retryStats } from "../store/retry.js";
import { buildIdentity } from "../version.js";
import { formatBytes } from "./format.js";
import type { Output } from "./output.js";
import { ConvertProgress, progressMode } from "./progress.js";

export interface ImportHfCliOptions {
  dtype?: ImportDtype;
  memory?: number;
  step?: number;
  force?: boolean;
  json?: boolean;
  progress?: boolean;
}

/** fuji's RMSNorm eps (fuji.py, model_config: RMSNorm eps=1e-5). */
const FUJI_EPS = 1e-5;

/**
 * How AXLearn restores the import: the fuji config of its dims, and the fine-tuning settings. The step holds
 * model/ leaves only; ModelStateScopeConverter (state_builder.py) restores exactly those (learner={},
 * prng_key={}) under TensorStoreStateStorageBuilder's default EXACT validation, and the trainer initializes the
 * learner and prng_key itself (_init_with_prebuilt_state).
 */
export function restoreSettings(r: ImportResult): { modelConfig: string; initStateBuilder: string; notes: string[] } {
  const d = r.dims;
  const args = [
    `num_layers=${d.layers}`,
    `hidden_dim=${d.hidden}`,
    `num_heads=${d.heads}`,
    // No default in fuji.model_config: None is its multi-head (fused QKV) choice.
    `num_kv_heads=${d.qkv === "grouped" ? d.kvHeads : "None"}`,
    `vocab_size=${d.vocab}`,
    `rope_theta=${pythonFloat(r.ropeTheta)}`,
    `shared_lm_head=${d.tied ? "True" : "False"}`,
    `ffn_dim=${d.ffn}`,
  ];
  const notes: string[] = [];
  if (r.rmsNormEps !== FUJI_EPS)
    notes.push(
      `config.json's rms_norm_eps is ${r.rmsNormEps}, fuji.model_config's RMSNorm eps ${FUJI_EPS}: set the norms' eps to ${r.rmsNormEps} (set_norm_recursively) for the same outputs`,
    );
  // EXACT compares dtypes too: a bfloat16 import restores into fuji's float32 parameters only up to dtype (the
  // read casts: TensorStoreStateStorage reads through ts.cast to the target's dtype).
  const validation = r.dtype === "float32" ? "EXACT" : "EXACT_UP_TO_DTYPE";
  return {
    modelConfig: `fuji.model_config(${args.join(", ")})`,
    initStateBuilder:
      "RestoreAndConvertBuilder.default_config().set(builder=TensorStoreStateStorageBuilder.default_config().set(" +
      `dir="${r.stepDir}", validation=CheckpointValidationType.${validation}), ` +
      "converter=ModelStateScopeConverter.default_config().set(source_trainer_config=<a config_for_function of the trainer config with that model>))",
    notes,
  };
}

function pythonFloat(x: number): string {
  return Number.isInteger(x) ? `${x}.0` : String(x);
}

export async function runImportHf(source: string, dest: string, o: ImportHfCliOptions, out: Output): Promise<number> {
  const started = Date.now();
  let progress: ConvertProgress | undefined;
  const result = await importHf(source, dest, {
    ...(o.dtype === undefined ? {} : { dtype: o.dtype }),
    ...(o.step === undefined ? {} : { step: o.step }),
    memoryBytes: o.memory ?? DEFAULT_IMPORT_MEMORY,
    force: o.force ?? false,
    onPlan: (plan) => {
      progress = new ConvertProgress(
        { bytes: plan.bytes, objectsPerArray: plan.chunksPerArray },
        progressMode(o, out.isTTY),
        (line) => out.writeErr(`${line}\n`),
        "importing",
      );
    },
    onChunk: (array, bytes) => progress?.object(array, bytes),
  }).finally(() => progress?.stop());
  const seconds = (Date.now() - started) / 1000;
  const restore = restoreSettings(result);
  if (o.json) {
    out.stdout(
      JSON.stringify(
        {
          ...result,
          committed: true,
          restore,
          storageRetries: retryStats().retries,
          seconds,
          mbPerSecond: Number((result.bytes / 1e6 / Math.max(seconds, 1e-3)).toFixed(1)),
          orbax2reg: buildIdentity(),
        },
        null,
        2,
      ),
    );
    return 0;
  }
  const d = result.dims;
  out.stdout(
    `Llama as fuji: ${d.layers} layers, hidden ${d.hidden}, ${d.heads} heads (${d.kvHeads} kv${d.qkv === "grouped" ? ", FusedGroupedQKVLinear" : ", FusedQKVLinear"}) x ${d.headDim}, ffn ${d.ffn}, vocab ${d.vocab}, ${d.tied ? "lm_head shared with the embedding" : "separate lm_head"}`,
  );
  if (result.alreadyImported) out.stdout(`already imported: ${result.stepDir} holds this import (nothing written)`);
  else
    out.stdout(
      `imported ${result.arrays} arrays, ${formatBytes(result.bytes)} ${result.dtype} in ${result.chunks} chunks in ${seconds.toFixed(1)} s; ` +
        `${result.chunksWritten} written, ${result.chunks - result.chunksWritten} already there${result.resumed ? " (resumed)" : ""}`,
    );
  out.stdout(`committed ${result.stepDir}/index (model/ leaves only)`);
  out.stdout(`restore with: ${restore.modelConfig}`);
  out.stdout(`fine-tune with: SpmdTrainer init_state_builder = ${restore.initStateBuilder}`);
  for (const n of restore.notes) out.stdout(`note: ${n}`);
  return 0;
}
