import { type ExportBegun, RUN_EXPORT_KEY } from "../../convert/work-dir.js";
import { mibToBytes } from "../../defaults.js";
import { UsageError } from "../../errors.js";
import {
  beginExport,
  DEFAULT_EXPORT_MEMORY,
  type ExportOptions,
  exportShards,
  finalizeExport,
  MIN_EXPORT_MEMORY,
} from "../../hf/export.js";
import { openStore } from "../../store/open.js";
import { retryStats } from "../../store/retry.js";
import type { Env } from "../api/env.js";
import * as fromEnv from "../api/env.js";
import type { Logger } from "../api/log.js";
import { exportRetentionFromEnv, pruneExports } from "./export-retention.js";
import type { Progress } from "./progress.js";
import { parseExportText } from "./workflow-argument.js";

/**
 * The export job's three phases (workflows/convert.yaml's export_step runs them on one Cloud Run job, the phase
 * an args override of each execution), each one call of the engine export-hf runs in one process
 * (src/hf/export.ts): export-begin plans and answers the tasks in the run directory, export-shards task I writes
 * the shards of task I, export-finalize checks every shard and writes the index last. Their settings come from
 * the plan job's exportEnvironment (src/cloud/job/workflow-argument.ts).
 */

export type ExportPhase = "export-begin" | "export-shards" | "export-finalize";

const WHOLE = { min: 0, max: Number.MAX_SAFE_INTEGER } as const;
const encodeJson = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));

/** What every export phase reads: the source, the export's options (the same in every call: they make the record). */
function exportSettings(env: Env) {
  const source = fromEnv.requiredString(env, "ORBAX2REG_SOURCE");
  const exp = parseExportText(fromEnv.requiredString(env, "ORBAX2REG_EXPORT"), source);
  // Bounded as export-hf --memory: the default keeps a task's peak RSS under 512 MiB (src/hf/export.ts).
  const memoryBytes = mibToBytes(
    fromEnv.integer(env, "ORBAX2REG_EXPORT_MEMORY_MIB", {
      min: Math.ceil(MIN_EXPORT_MEMORY / 2 ** 20),
      max: 1 << 20,
      fallback: DEFAULT_EXPORT_MEMORY / 2 ** 20,
    }),
  );
  const options: ExportOptions = {
    dtype: exp.dtype,
    maxShardSize: exp.maxShardSize,
    memoryBytes,
    force: exp.force,
    ...(exp.tokenizer === undefined ? {} : { tokenizer: exp.tokenizer }),
  };
  return { source, exp, options, run: fromEnv.requiredString(env, "ORBAX2REG_RUN") };
}

/**
 * Runs one export phase. `beforeCommit` runs once export-finalize has checked every shard, right before it writes
 * anything (the stop signal and `cloud cancel`'s marker, as the conversion's finalize checks them).
 */
export async function runExportPhase(
  phase: ExportPhase,
  env: Env,
  log: Logger,
  started: number,
  progress: Progress,
  beforeCommit: () => Promise<void>,
  stop?: AbortSignal,
): Promise<void> {
  const { source, exp, options, run } = exportSettings(env);
  const step = fromEnv.integer(env, "ORBAX2REG_STEP", WHOLE);
  const elog = log.with({ phase, step, export: exp.destination });
  const seconds = () => (Date.now() - started) / 1000;
  if (phase === "export-begin") {
    const began = await beginExport(source, exp.destination, { ...options, tasks: exp.tasks });
    const answer: ExportBegun = {
      tasks: began.alreadyExported ? 0 : began.tasks.length,
      shards: began.shards,
      totalSize: began.totalSize,
      alreadyExported: began.alreadyExported,
      assignments: began.tasks.map((t) => ({ index: t.index, shards: [...t.shards], bytes: t.bytes })),
    };
    await (await openStore(run)).write(RUN_EXPORT_KEY, encodeJson(answer));
    progress.set({ objects: began.shards, bytes: began.totalSize });
    elog.info(began.alreadyExported ? "already exported; nothing to do" : "export begun", {
      tasks: answer.tasks,
      shards: answer.shards,
      bytes: answer.totalSize,
      seconds: seconds(),
      storageRetries: retryStats(),
    });
    return;
  }
  if (phase === "export-shards") {
    const { index: task } = fromEnv.cloudRunTask(env);
    const begun = JSON.parse(new TextDecoder().decode(await (await openStore(run)).read(RUN_EXPORT_KEY))) as ExportBegun;
    const mine = begun.assignments.find((a) => a.index === task);
    // More tasks than the plan has (a task count set by hand): nothing for this one.
    if (mine === undefined) {
      elog.info("no shards for this task", { task, tasks: begun.assignments.length });
      return;
    }
    progress.set({ objects: mine.shards.length, bytes: mine.bytes });
    progress.write();
    const written = await exportShards(
      source,
      exp.destination,
      { ...options, ...(stop ? { signal: stop } : {}), onTensor: (_name, bytes) => progress.advance(0, bytes) },
      mine.shards,
    );
    progress.set({ objectsDone: mine.shards.length, bytesDone: mine.bytes });
    elog.info("shards written", {
      task,
      shards: mine.shards,
      written: written.written.length,
      kept: written.kept.length,
      bytes: written.bytes,
      chunkRereads: written.chunkRereads,
      seconds: seconds(),
      mbPerSecond: Number((written.bytes / 1e6 / Math.max(seconds(), 1e-3)).toFixed(1)),
      storageRetries: retryStats(),
    });
    return;
  }
  if (phase !== "export-finalize") throw new UsageError(`unknown export phase ${phase}`);
  const retention = exportRetentionFromEnv(env); // checked before committing: a bad setting commits nothing
  // Checked by the engine between its shard checks and its first write (the index is written last).
  const result = await finalizeExport(source, exp.destination, options, { beforeCommit });
  progress.set({ objects: result.shards.length, objectsDone: result.shards.length, bytes: result.totalSize, bytesDone: result.totalSize });
  elog.info("export committed", {
    shards: result.shards.length,
    tensors: result.tensors,
    bytes: result.totalSize,
    alreadyExported: result.alreadyExported,
    tokenizer: result.tokenizer.line,
    seconds: seconds(),
    storageRetries: retryStats(),
  });
  await pruneExports(retention, exp.destination, step, elog); // older exports; never fails the job
}
