import { EXIT_CHECK_FAILED, printable } from "../errors.js";
import { DEFAULT_EXPORT_MEMORY, exportHf } from "../hf/export.js";
import { verifyExport } from "../hf/verify.js";
import type { TokenizerChoice } from "../hf/vocabularies.js";
import { retryStats } from "../store/retry.js";
import { buildIdentity } from "../version.js";
import { formatBytes } from "./format.js";
import type { Output } from "./output.js";
import { ConvertProgress, CountProgress, progressMode } from "./progress.js";

export interface ExportHfCliOptions {
  dtype?: "bfloat16" | "float32";
  maxShardSize?: number;
  memory?: number;
  fujiVersion?: "v1" | "v2" | "v3";
  ropeTheta?: number;
  rmsNormEps?: number;
  maxPositionEmbeddings?: number;
  force?: boolean;
  tokenizer?: TokenizerChoice;
  step?: number;
  json?: boolean;
  progress?: boolean;
}

export async function runExportHf(source: string, dest: string, o: ExportHfCliOptions, out: Output): Promise<number> {
  const started = Date.now();
  let progress: ConvertProgress | undefined;
  const result = await exportHf(source, dest, {
    ...(o.dtype === undefined ? {} : { dtype: o.dtype }),
    ...(o.maxShardSize === undefined ? {} : { maxShardSize: o.maxShardSize }),
    ...(o.fujiVersion === undefined ? {} : { fujiVersion: o.fujiVersion }),
    ...(o.ropeTheta === undefined ? {} : { ropeTheta: o.ropeTheta }),
    ...(o.rmsNormEps === undefined ? {} : { rmsNormEps: o.rmsNormEps }),
    ...(o.maxPositionEmbeddings === undefined ? {} : { maxPositionEmbeddings: o.maxPositionEmbeddings }),
    memoryBytes: o.memory ?? DEFAULT_EXPORT_MEMORY,
    force: o.force ?? false,
    ...(o.tokenizer === undefined ? {} : { tokenizer: o.tokenizer }),
    ...(o.step === undefined ? {} : { step: o.step }),
    onPlan: (plan) => {
      progress = new ConvertProgress(
        { bytes: plan.bytes, objectsPerArray: new Map(plan.names.map((n) => [n, 1])) },
        progressMode(o, out.isTTY),
        (line) => out.writeErr(`${line}\n`),
        "exporting",
      );
    },
    onTensor: (name, bytes) => progress?.object(name, bytes),
    // Stopped however the export ends: a bar left running on a terminal keeps the process from exiting.
  }).finally(() => progress?.stop());
  if (result.memoryWithoutRereads !== undefined)
    out.warn(
      `--memory ${formatBytes(o.memory ?? DEFAULT_EXPORT_MEMORY)} forced ${result.chunkRereads} chunk re-reads (decoded again from their start); --memory ${Math.ceil(result.memoryWithoutRereads / 2 ** 20)} decodes each chunk once`,
    );
  const seconds = (Date.now() - started) / 1000;
  const c = result.built.config;
  const summary = {
    source: result.source.location,
    sourceKind: result.source.kind,
    step: result.source.step ?? null,
    ...(result.source.chosenBy === undefined ? {} : { stepChosenBy: result.source.chosenBy }),
    destination: result.destination,
    fujiVersion: result.built.version,
    fujiVersionSource: result.built.versionSource,
    dtype: result.dtype,
    tensors: result.tensors,
    totalSize: result.totalSize,
    shards: result.shards,
    config: c,
    configSources: result.built.sources,
    tokenizer: result.tokenizer,
    skipped: result.skipped,
    alreadyExported: result.alreadyExported,
    resumed: result.resumed,
    chunkRereads: result.chunkRereads,
    openDecoders: result.openDecoders,
    decodersNeeded: result.decodersNeeded,
    decoderBytes: result.decoderBytes,
    peakOpenDecoders: result.peakOpenDecoders,
    spilledArrays: result.spilledArrays,
    ...(result.memoryWithoutRereads === undefined ? {} : { memoryWithoutRereads: result.memoryWithoutRereads }),
    committed: true,
    storageRetries: retryStats().retries,
    seconds,
    mbPerSecond: Number((result.totalSize / 1e6 / Math.max(seconds, 1e-3)).toFixed(1)),
    orbax2reg: buildIdentity(),
  };
  if (o.json) {
    out.stdout(JSON.stringify(summary, null, 2));
    return 0;
  }
  const d = result.dims;
  out.stdout(
    `fuji ${result.built.version} (${result.built.versionSource}): ${d.layers} layers, hidden ${d.hidden}, ${d.heads} heads (${d.kvHeads} kv) x ${d.headDim}, ffn ${d.ffn}, vocab ${d.vocab}, ${d.tied ? "tied" : "separate"} lm_head`,
  );
  const src = result.built.sources;
  out.stdout(`rope_theta ${c.rope_theta}: ${src.rope_theta}`);
  out.stdout(`rms_norm_eps ${c.rms_norm_eps}: ${src.rms_norm_eps}`);
  out.stdout(`max_position_embeddings ${c.max_position_embeddings}: ${src.max_position_embeddings}`);
  out.stdout(`tokenizer: ${result.tokenizer.line}`);
  // Leaves outside model/ (optimizer state, prng_key) are skipped silently; --json lists them.
  if (result.alreadyExported) {
    out.stdout(`already exported: ${result.destination} holds this export (${result.shards.length} shard(s) checked, nothing written)`);
    return 0;
  }
  const written = result.shards.filter((s) => s.written).length;
  out.stdout(
    `exported ${result.tensors} tensors, ${formatBytes(result.totalSize)} ${result.dtype} in ${result.shards.length} shard(s) in ${seconds.toFixed(1)} s; ` +
      `${written} shard(s) written, ${result.shards.length - written} already there${result.resumed ? " (resumed)" : ""}`,
  );
  out.stdout(`committed ${result.destination.replace(/\/+$/, "")}/model.safetensors.index.json`);
  return 0;
}

export async function runVerifyExport(
  source: string,
  dest: string,
  o: { json?: boolean; progress?: boolean },
  out: Output,
): Promise<number> {
  const progress = new CountProgress("verifying tensors", progressMode(o, out.isTTY), (line) => out.writeErr(`${line}\n`));
  const result = await verifyExport(source, dest, (done, total) => progress.update(done, total));
  progress.stop();
  if (o.json) out.stdout(JSON.stringify(result, null, 2));
  else {
    for (const c of result.checks) if (!c.ok) out.stdout(printable(`FAIL ${c.name}${c.detail ? `: ${c.detail}` : ""}`));
    out.stdout(`${result.passed} passed, ${result.failed} failed`);
  }
  return result.failed === 0 ? 0 : EXIT_CHECK_FAILED;
}
