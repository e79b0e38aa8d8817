import { INDEX_NAME } from "../../hf/shards.js";
import { stepDirName } from "../../orbax/step.js";
import { mapLimited } from "../../util/budget.js";
import { isLive, rootLabel, type WorkflowArgument, type WorkflowExport } from "../api/executions.js";
import { expand } from "../trigger/classify.js";
import { type StartDeps, startByHand } from "../trigger/start.js";
import { type FleetDeps, locate, parseRoot, type StepRow, stepStatuses } from "./status.js";

/** Steps started at once. */
const START_CONCURRENCY = 8;

/**
 * Converting the steps a checkpoint root already holds (written before the pipeline was deployed, or
 * whose conversion failed): every committed step in range that has neither a converted step nor a live
 * claim is started through the same claim as the trigger, at most `maxRunning` conversions of the root
 * running at once.
 */
export interface BackfillOptions {
  readonly from?: number;
  readonly to?: number;
  /** Only steps divisible by this (as the pipeline's convert_every_n_steps). */
  readonly every: number;
  readonly maxRunning: number;
  readonly dryRun: boolean;
  readonly groups: number;
  /** How often to look again while `maxRunning` conversions run. */
  readonly pollMs?: number;
  /** Called for each step as it is decided, for progress on a terminal. */
  readonly onEntry?: (entry: BackfillEntry) => void;
  readonly sleep?: (ms: number) => Promise<void>;
  /**
   * Exports instead of conversions: every committed step in range the rule asks for (or only `steps`, when
   * given) whose export folder has no index and no export running is started export-only ("convert": false), as
   * `cloud start --export --export-only` starts one, through the step's same claim.
   */
  readonly export?: BackfillExport;
}

/** The deployment's hf_export rule (the function's ORBAX2REG_EXPORT_* settings) and, optionally, the steps asked. */
export interface BackfillExport {
  /** The export's folder per step: placeholders {bucket}, {root}, {step}. */
  readonly destinationTemplate: string;
  readonly everyNSteps?: number;
  readonly ruleSteps: readonly number[];
  /** Passed in every argument's "export" as they are (dtype, tokenizer, shard size, tasks). */
  readonly settings: Omit<WorkflowExport, "destination">;
  /** These steps instead of the rule's. */
  readonly steps?: readonly number[];
}
export type BackfillEntry =
  | { readonly step: number; readonly action: "started"; readonly execution: string }
  | { readonly step: number; readonly action: "would-start"; readonly why: string }
  | { readonly step: number; readonly action: "skipped"; readonly why: string };

export async function backfill(rootLocation: string, options: BackfillOptions, deps: FleetDeps & StartDeps): Promise<BackfillEntry[]> {
  const sleep = options.sleep ?? ((ms: number) => new Promise<void>((r) => setTimeout(r, ms)));
  const root = parseRoot(rootLocation);
  const rows = (await stepStatuses(root.url, undefined, deps)).filter(
    (r) => (options.from === undefined || r.step >= options.from) && (options.to === undefined || r.step <= options.to),
  );
  // Live executions of the root, from one paged BASIC listing (the state is all it needs): looked at once,
  // then only while `maxRunning` are running, not once per step.
  const liveCount = async () => (await deps.executions.find(deps.workflow, { source: rootLabel(root.url) })).filter(isLive).length;
  const entries: BackfillEntry[] = [];
  const add = (e: BackfillEntry) => {
    entries.push(e);
    options.onEntry?.(e);
  };
  let live = options.dryRun ? 0 : await liveCount();
  let batch: StepRow[] = [];
  /** Starts the batch's steps a few at a time (each start is a handful of requests: claim, listing, create). */
  const flush = async () => {
    const rowsNow = batch;
    batch = [];
    const outcomes = await mapLimited(rowsNow, START_CONCURRENCY, (row) => {
      const where = locate(root, row.step, deps.destinationTemplate);
      const argument: WorkflowArgument = {
        source: where.source,
        destination: where.destination,
        step: row.step,
        groups: options.groups,
        ...(options.export === undefined
          ? {}
          : { convert: false, export: { destination: exportFolder(root, row.step, options.export), ...options.export.settings } }),
      };
      return startByHand({ argument }, deps);
    });
    outcomes.forEach((outcome, i) => {
      const step = (rowsNow[i] as StepRow).step;
      if (outcome.kind === "refused") add({ step, action: "skipped", why: `the workflow refused to start: ${outcome.message}` });
      else {
        live++;
        add({ step, action: "started", execution: outcome.execution });
      }
    });
  };
  const exported = options.export;
  // Exports: an index in the step's export folder means done, whatever the executions' history still holds.
  const exportIndexed =
    exported === undefined
      ? new Set<number>()
      : new Set(
          (
            await mapLimited(rows, START_CONCURRENCY, async (row) =>
              asksExport(exported, row.step) &&
              (await (await deps.openStore(exportFolder(root, row.step, exported))).stat(INDEX_NAME)) !== undefined
                ? row.step
                : undefined,
            )
          ).filter((s) => s !== undefined),
        );
  for (const row of rows) {
    const skip =
      options.every > 1 && row.step % options.every !== 0
        ? `not a multiple of --every ${options.every}`
        : exported === undefined
          ? whySkip(row)
          : whySkipExport(row, exported, exportIndexed.has(row.step));
    if (skip !== undefined) {
      add({ step: row.step, action: "skipped", why: skip });
      continue;
    }
    const why =
      exported !== undefined
        ? row.export === null
          ? "not exported"
          : `export ${row.export.state} before`
        : row.status.state === "not-converted"
          ? "not converted"
          : row.status.state === "exported" || ("exportOnly" in row.status && row.status.exportOnly)
            ? `not converted (an export alone ${row.status.state} before)`
            : `${row.status.state} before`;
    if (options.dryRun) {
      add({ step: row.step, action: "would-start", why });
      continue;
    }
    while (live + batch.length >= options.maxRunning) {
      if (batch.length > 0) {
        await flush();
        continue;
      }
      await sleep(options.pollMs ?? 15_000);
      live = await liveCount();
    }
    batch.push(row);
    if (batch.length >= START_CONCURRENCY) await flush();
  }
  await flush();
  // In step order, as the rows were (a batch's starts are reported after the skips that came meanwhile).
  return entries.sort((a, b) => a.step - b.step);
}

/** The step's export folder by the rule's template. */
function exportFolder(root: ReturnType<typeof parseRoot>, step: number, e: BackfillExport): string {
  return expand(e.destinationTemplate, { bucket: root.bucket, root: root.path, step: stepDirName(step) });
}

/** Whether the step is one to export: in the given list, else by the rule (as the trigger's classify). */
function asksExport(e: BackfillExport, step: number): boolean {
  if (e.steps !== undefined) return e.steps.includes(step);
  return e.ruleSteps.includes(step) || (e.everyNSteps !== undefined && e.everyNSteps > 0 && step % e.everyNSteps === 0);
}

/** Why a step's export is left alone, or undefined when it should be exported. */
function whySkipExport(row: StepRow, e: BackfillExport, indexed: boolean): string | undefined {
  if (!asksExport(e, row.step)) return e.steps !== undefined ? "not a step asked for" : "not a step hf_export asks for";
  if (indexed) return "exported";
  const s = row.status;
  // The step's claim is one for its conversion and its export: a run or a fresh claim holds it either way.
  if (s.state === "running" || s.state === "exporting") return `${s.state} (${s.execution})`;
  if (s.state === "claimed" && !s.expired) return `claimed at ${s.claimedAt}, being started`;
  if (!row.committed) return s.state === "not-converted" ? s.reason : "the Orbax step is gone or not committed";
  const x = row.export;
  if (x?.state === "failed" && !x.retryable) return `export failed, and running it again cannot help: ${x.error}`;
  return undefined;
}

/** Why a step is left alone, or undefined when it should be converted. */
function whySkip(row: StepRow): string | undefined {
  const s = row.status;
  switch (s.state) {
    case "converted":
      return "converted";
    case "running":
      return `running (${s.execution})`;
    // The step's claim names the export's execution while it runs; done, it says nothing of converting the step.
    case "exporting":
      return `exporting (${s.execution})`;
    case "exported":
      return row.committed ? undefined : "the Orbax step is gone or not committed";
    case "claimed":
      return s.expired ? undefined : `claimed at ${s.claimedAt}, being started`;
    case "not-converted":
      return s.committed ? undefined : s.reason;
    case "failed":
      if (s.exportOnly) return row.committed ? undefined : "the Orbax step is gone or not committed";
      return s.retryable ? undefined : `failed, and running it again cannot help: ${s.error}`;
    case "cancelled":
      return undefined;
  }
}
