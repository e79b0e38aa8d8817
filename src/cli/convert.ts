import { cloudRunTask } from "../cloud/api/env.js";
import {
  convert,
  finalizePhase,
  groupPhase,
  loadGroup,
  type PlanPhaseOptions,
  planPhase,
  taskObjects,
  taskParts,
} from "../convert/convert.js";
import type { ExecuteOptions } from "../convert/execute.js";
import { readPart } from "../convert/ownership.js";
import type { Plan } from "../convert/plan-format.js";
import { verify } from "../convert/verify.js";
import { DEFAULT_CONCURRENCY, DEFAULT_MEMORY_MIB, DEFAULT_PLAN_GROUPS, mibToBytes } from "../defaults.js";
import { EXIT_CHECK_FAILED, printable, UsageError } from "../errors.js";
import { type RootStep, TRACKER_FILE } from "../orbax/step.js";
import { retryStats } from "../store/retry.js";
import { buildIdentity } from "../version.js";
import type { CastDtype } from "../zarr/cast.js";
import { chunkGrid, product } from "../zarr/metadata.js";
import { formatBytes } from "./format.js";
import type { Output } from "./output.js";
import { ConvertProgress, CountProgress, type ProgressScope, progressMode, progressScope } from "./progress.js";

export interface ConvertCliOptions {
  step?: number;
  paramsOnly?: boolean;
  dtype?: CastDtype;
  groups?: number;
  concurrency?: number;
  memory?: number;
  dryRun?: boolean;
  force?: boolean;
  allowUncommitted?: boolean;
  json?: boolean;
  /** false with --no-progress. */
  progress?: boolean;
}

function executeOptions(o: ConvertCliOptions, progress: ConvertProgress | undefined): ExecuteOptions {
  return {
    concurrency: o.concurrency ?? DEFAULT_CONCURRENCY,
    memoryBytes: mibToBytes(o.memory ?? DEFAULT_MEMORY_MIB),
    onObject: (e) => progress?.object(e.target, e.bytes),
  };
}

function planSummary(plan: Plan) {
  return {
    step: plan.step,
    source: `${plan.source.root}${plan.source.stepDir ? `/${plan.source.stepDir}` : ""}`,
    destination: `${plan.destination.root}/${plan.destination.stepDir}`,
    arrays: plan.totals.arrays,
    objects: plan.totals.objects,
    bytes: plan.totals.bytes,
    files: plan.files.length,
    groups: plan.groups.map((g, i) => ({ group: i, arrays: g.arrays, objects: g.end - g.start, bytes: g.bytes })),
  };
}

/** A whole conversion's progress scope, from the plan's arrays: each writes its `.zarray` and every chunk of its grid. */
function wholeScope(plan: Plan): ProgressScope {
  const objectsPerArray = new Map<string, number>();
  for (const a of plan.arrays) objectsPerArray.set(`gda/${a.path}`, 1 + product(chunkGrid(a)));
  return { bytes: plan.totals.bytes, objectsPerArray };
}

function planOptions(o: ConvertCliOptions): PlanPhaseOptions {
  return {
    groups: o.groups ?? DEFAULT_PLAN_GROUPS,
    paramsOnly: o.paramsOnly ?? false,
    ...(o.dtype === undefined ? {} : { dtype: o.dtype }),
    allowUncommitted: o.allowUncommitted ?? false,
    force: o.force ?? false,
    dryRun: o.dryRun ?? false,
    ...(o.step === undefined ? {} : { step: o.step }),
  };
}

/** The --json fields saying how a root's step was chosen (none when the source was a step). */
function choiceFields(chosen: RootStep | undefined): { stepChosenBy?: string; stepChoiceNote?: string } {
  if (chosen === undefined) return {};
  return { stepChosenBy: chosen.chosenBy, ...(chosen.note === undefined ? {} : { stepChoiceNote: chosen.note }) };
}

/** One line saying how a root's step was chosen. */
function choiceLine(chosen: RootStep): string {
  const how = chosen.chosenBy === "tracker" ? `named by the root's ${TRACKER_FILE}` : "the latest committed step under the root";
  return `step ${chosen.step} (${chosen.name}): ${how}${chosen.note === undefined ? "" : `; ${chosen.note}`}`;
}

export async function runConvert(source: string, dest: string, o: ConvertCliOptions, out: Output): Promise<number> {
  const started = Date.now();
  const common = planOptions(o);
  let progress: ConvertProgress | undefined;
  const result = await convert(source, dest, {
    ...common,
    ...executeOptions(o, undefined),
    onObject: (e) => progress?.object(e.target, e.bytes),
    onPlan: (plan) => {
      progress = new ConvertProgress(wholeScope(plan), progressMode(o, out.isTTY), (line) => out.writeErr(`${line}\n`));
    },
  });
  progress?.stop();
  const chosen = result.chosen;
  const seconds = (Date.now() - started) / 1000;
  const summary = {
    ...planSummary(result.plan),
    ...choiceFields(chosen),
    dryRun: common.dryRun,
    resumed: result.reused,
    alreadyConverted: result.alreadyConverted,
    written: result.execute?.written ?? 0,
    skipped: result.execute?.skipped ?? 0,
    committed: result.finalize !== undefined,
    // Transient storage faults this run rode out (src/store/retry.ts); by kind in storageRetriesByKind.
    storageRetries: retryStats().retries,
    storageRetriesByKind: retryStats().byKind,
    seconds,
    mbPerSecond: Number((result.plan.totals.bytes / 1e6 / Math.max(seconds, 1e-3)).toFixed(1)),
    // Which orbax2reg made the result (src/version.ts).
    orbax2reg: buildIdentity(),
  };
  if (o.json) {
    out.stdout(JSON.stringify(summary, null, 2));
    return 0;
  }
  const p = result.plan;
  if (chosen !== undefined) out.stdout(choiceLine(chosen));
  if (common.dryRun) {
    out.stdout(
      `dry run: would convert step ${p.step}: ${p.totals.arrays} arrays, ${p.totals.objects} objects, ${formatBytes(p.totals.bytes)}, ${p.files.length} iterator file(s)`,
    );
    out.stdout(`into ${summary.destination}; nothing was written`);
    return 0;
  }
  if (result.alreadyConverted) {
    out.stdout(
      `already converted: ${summary.destination} is committed from this source (${summary.skipped} objects checked, nothing written)`,
    );
    return 0;
  }
  out.stdout(
    `converted step ${p.step}: ${p.totals.arrays} arrays, ${formatBytes(p.totals.bytes)} in ${seconds.toFixed(1)} s (${summary.mbPerSecond} MB/s); ` +
      `${summary.written} objects written, ${summary.skipped} already there${result.reused ? " (resumed)" : ""}`,
  );
  out.stdout(`committed ${summary.destination}/index`);
  return 0;
}

export async function runPlan(source: string, dest: string, o: ConvertCliOptions, out: Output): Promise<number> {
  const { plan, reused, chosen } = await planPhase(source, dest, planOptions(o));
  const summary = { ...planSummary(plan), ...choiceFields(chosen), reused };
  if (o.json) out.stdout(JSON.stringify(summary, null, 2));
  else {
    if (chosen !== undefined) out.stdout(choiceLine(chosen));
    out.stdout(
      `${reused ? "reusing" : o.dryRun ? "would write" : "wrote"} plan for step ${plan.step}: ${plan.totals.arrays} arrays, ${plan.totals.objects} objects, ${formatBytes(plan.totals.bytes)}`,
    );
    for (const g of summary.groups) out.stdout(`  group ${g.group}: ${g.arrays} arrays, ${g.objects} objects, ${formatBytes(g.bytes)}`);
  }
  return 0;
}

export async function runConvertGroup(
  dest: string,
  o: ConvertCliOptions & { group: number; taskIndex?: number; taskCount?: number },
  out: Output,
): Promise<number> {
  const step = requireStep(o.step);
  const { plan, destination } = await loadGroup(dest, step, o.group);
  // Run as a Cloud Run job task, the CLI splits the group as the job does: the flags default to the task's
  // index and count (0 and 1 elsewhere). The environment is read only when a flag leaves it to.
  const task = o.taskIndex !== undefined && o.taskCount !== undefined ? undefined : cloudRunTask(process.env);
  const taskIndex = o.taskIndex ?? task?.index;
  const taskCount = o.taskCount ?? task?.count;
  // The task's parts read once ahead for the bar's totals (a part at a time: the cost of the task's own objects).
  const scope = { bytes: 0, objectsPerArray: new Map<string, number>() };
  for (const slice of taskParts(plan, o.group, taskIndex ?? 0, taskCount ?? 1)) {
    progressScope(taskObjects(await readPart(destination, plan, slice.ref), slice), scope);
  }
  const progress = new ConvertProgress(
    scope,
    progressMode(o, out.isTTY),
    (line) => out.writeErr(`${line}\n`),
    `converting group ${o.group}`,
  );
  const report = await groupPhase(dest, step, o.group, { ...executeOptions(o, progress), taskIndex, taskCount });
  progress.stop();
  if (o.json) out.stdout(JSON.stringify(report, null, 2));
  else
    out.stdout(
      `group ${report.group}: ${report.written} objects written, ${report.skipped} already there, ${formatBytes(report.bytesWritten)} in ${report.seconds.toFixed(1)} s`,
    );
  return 0;
}

export async function runFinalize(dest: string, o: ConvertCliOptions, out: Output): Promise<number> {
  const report = await finalizePhase(dest, requireStep(o.step));
  const { plan, ...rest } = report;
  if (o.json)
    out.stdout(JSON.stringify({ step: plan.step, destination: `${plan.destination.root}/${plan.destination.stepDir}`, ...rest }, null, 2));
  else
    out.stdout(
      `${report.indexWritten ? "committed" : "already committed"} ${plan.destination.root}/${plan.destination.stepDir}/index (${report.objects} objects, ${report.files} iterator file(s) copied)`,
    );
  return 0;
}

export async function runVerify(orbax: string, regular: string, o: { json?: boolean; progress?: boolean }, out: Output): Promise<number> {
  // An export-hf destination is known by its index (the export's commit marker).
  if (await (await import("../hf/verify.js")).isExport(regular))
    return (await import("./export-hf.js")).runVerifyExport(orbax, regular, o, out);
  const progress = new CountProgress("verifying arrays", progressMode(o, out.isTTY), (line) => out.writeErr(`${line}\n`));
  const result = await verify(orbax, regular, (done, total) => progress.update(done, total));
  progress.stop();
  if (o.json) out.stdout(JSON.stringify(result, null, 2));
  else {
    // Names and details quote keys and paths from the checkpoints: made printable.
    for (const c of result.checks) out.stdout(printable(`${c.ok ? "PASS" : "FAIL"} ${c.name}${c.detail ? `: ${c.detail}` : ""}`));
    out.stdout(`${result.passed} passed, ${result.failed} failed`);
  }
  // Not 1 (a bug, a fault): the comparison ran to its end, and its answer is no.
  return result.failed === 0 ? 0 : EXIT_CHECK_FAILED;
}

function requireStep(step: number | undefined): number {
  if (step === undefined) throw new UsageError("--step is required: the plan lives under <dest-root>/step_XXXXXXXX/");
  return step;
}
