import { EXIT_CHECK_FAILED, printable, UsageError } from "../errors.js";
import {
  beginExport,
  DEFAULT_EXPORT_MEMORY,
  type ExportOptions,
  exportHf,
  exportShards,
  finalizeExport,
  planExportTasks,
} from "../hf/export.js";
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
  /** The export shared among tasks: --begin, --task-index, --finalize (all with --task-count but --finalize). */
  begin?: boolean;
  taskIndex?: number;
  taskCount?: number;
  finalize?: boolean;
}

/** Which step of a shared export the flags ask for, or the whole export (refused when they do not agree). */
function mode(o: ExportHfCliOptions): "whole" | "begin" | "task" | "finalize" {
  const asked = [o.begin && "--begin", o.taskIndex !== undefined && "--task-index", o.finalize && "--finalize"].filter(Boolean);
  if (asked.length > 1) throw new UsageError(`${asked.join(" and ")} are steps of their own: give one`);
  if (o.begin || o.taskIndex !== undefined) {
    if (o.taskCount === undefined) throw new UsageError(`${asked[0]} needs --task-count`);
    if (o.taskIndex !== undefined && o.taskIndex >= o.taskCount)
      throw new UsageError(`--task-index ${o.taskIndex} is not below --task-count ${o.taskCount}`);
    return o.begin ? "begin" : "task";
  }
  if (o.taskCount !== undefined) throw new UsageError("--task-count goes with --begin or --task-index");
  return o.finalize ? "finalize" : "whole";
}

export async function runExportHf(source: string, dest: string, o: ExportHfCliOptions, out: Output): Promise<number> {
  const step = mode(o);
  const started = Date.now();
  let progress: ConvertProgress | undefined;
  const options: ExportOptions = {
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
  };
  if (step === "begin") return begin(source, dest, { ...options, tasks: o.taskCount as number }, o, out);
  if (step === "task") return task(source, dest, options, o.taskIndex as number, o.taskCount as number, o, out);
  const whole = step === "whole" ? exportHf : finalizeExport;
  const result = await whole(source, dest, {
    ...options,
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
  if (step === "finalize") {
    out.stdout(`checked ${result.shards.length} shard(s), ${formatBytes(result.totalSize)} ${result.dtype}, in ${seconds.toFixed(1)} s`);
    out.stdout(`committed ${result.destination.replace(/\/+$/, "")}/model.safetensors.index.json`);
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

/** --begin: the destination checked and the record written; each task's shards printed. */
async function begin(source: string, dest: string, options: ExportOptions & { tasks: number }, o: ExportHfCliOptions, out: Output) {
  const b = await beginExport(source, dest, options);
  if (o.json) {
    out.stdout(JSON.stringify(b, null, 2));
    return 0;
  }
  if (b.alreadyExported) {
    out.stdout(`already exported: ${dest} holds this export (${b.shards} shard(s) checked, nothing written)`);
    return 0;
  }
  out.stdout(`begun: ${b.shards} shard(s), ${formatBytes(b.totalSize)}, in ${b.tasks.length} task(s)`);
  for (const t of b.tasks)
    out.stdout(
      `task ${t.index}: ${t.shards[0]}${t.shards.length > 1 ? ` .. ${t.shards.at(-1)}` : ""} (${t.shards.length} shard(s), ${formatBytes(t.bytes)})`,
    );
  return 0;
}

/** --task-index I: task I's shards of the --task-count plan (the plan is the source's and the options'). */
async function task(
  source: string,
  dest: string,
  options: ExportOptions,
  index: number,
  count: number,
  o: ExportHfCliOptions,
  out: Output,
) {
  const started = Date.now();
  const tasks = await planExportTasks(source, { ...options, tasks: count });
  const mine = tasks[index];
  // Fewer shards than tasks: the tasks past the last shard have nothing to write.
  const w =
    mine === undefined ? { written: [], kept: [], bytes: 0, chunkRereads: 0 } : await exportShards(source, dest, options, mine.shards);
  const seconds = (Date.now() - started) / 1000;
  if (o.json) {
    out.stdout(JSON.stringify({ task: index, tasks: tasks.length, shards: mine?.shards ?? [], ...w, seconds }, null, 2));
    return 0;
  }
  out.stdout(
    `task ${index} of ${count}: ${w.written.length} shard(s) written (${formatBytes(w.bytes)}), ${w.kept.length} already there, in ${seconds.toFixed(1)} s; ${w.chunkRereads} chunk re-read(s)`,
  );
  return 0;
}
