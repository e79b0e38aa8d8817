import { executionsClient, workflowsExecutions } from "../cloud/api/executions.js";
import type { Logger } from "../cloud/api/log.js";
import { runExecutionsClient, runJobExecutions } from "../cloud/api/run-executions.js";
import { parseWorkflowArgument } from "../cloud/job/workflow-argument.js";
import { type BackfillEntry, type BackfillExport, backfill } from "../cloud/ops/backfill.js";
import { cancelStep } from "../cloud/ops/cancel.js";
import { type CloudFlags, resolveCloudSettings } from "../cloud/ops/settings.js";
import { type ExportStatus, type FleetDeps, locate, parseRoot, type StepRow, type StepStatus, stepStatuses } from "../cloud/ops/status.js";
import { exportFromEnv } from "../cloud/trigger/config.js";
import { type StartDeps, startByHand } from "../cloud/trigger/start.js";
import { UsageError } from "../errors.js";
import { parseStepName } from "../orbax/step.js";
import { openStore } from "../store/open.js";
import { formatBytes, table } from "./format.js";
import type { Output } from "./output.js";

// `orbax2reg cloud status | start | backfill | cancel`: the same claim, labels and records the trigger
// function and the jobs use (src/cloud/ops/{status,backfill,cancel}.ts, src/cloud/trigger/start.ts); this file only parses and prints.

interface FleetFlags extends CloudFlags {
  readonly json?: boolean;
}

/** Where the pipeline is, and clients for it. The endpoints point the clients at local emulators in tests. */
async function fleetDeps(flags: FleetFlags, out: Output): Promise<FleetDeps & StartDeps & { groups: number }> {
  const settings = resolveCloudSettings(flags, process.env);
  return {
    workflow: settings.workflow,
    destinationTemplate: settings.destinationTemplate,
    groups: settings.groups,
    claimLeaseMs: settings.claimLeaseSeconds * 1000,
    openStore,
    executions: workflowsExecutions(await executionsClient(process.env.ORBAX2REG_WORKFLOWS_ENDPOINT)),
    jobs: runJobExecutions(await runExecutionsClient(process.env.ORBAX2REG_RUN_ENDPOINT)),
    log: cliLogger(out),
  };
}

/** The claim's notes (a takeover, an adopted execution) as warnings; routine lines are dropped. */
function cliLogger(out: Output): Logger {
  const logger: Logger = {
    log: (severity, message) => {
      if (severity === "WARNING" || severity === "ERROR") out.warn(message);
    },
    info: () => {},
    warn: (m) => out.warn(m),
    error: (m) => out.warn(m),
    with: () => logger,
  };
  return logger;
}

export interface StatusFlags extends FleetFlags {
  readonly step?: number;
  readonly watch?: boolean;
  readonly interval?: number;
}

/** `orbax2reg cloud status <checkpoint-root>`: one line per step. Exit 0. */
export async function runCloudStatus(root: string, flags: StatusFlags, out: Output): Promise<number> {
  const deps = await fleetDeps(flags, out);
  for (;;) {
    const rows = await stepStatuses(root, flags.step, deps);
    if (flags.json) out.stdout(JSON.stringify(rows, null, 2));
    else out.stdout(statusTable(rows));
    const busy = (r: StepRow) =>
      r.status.state === "running" || r.status.state === "exporting" || r.status.state === "claimed" || r.export?.state === "running";
    if (!flags.watch || !rows.some(busy)) return 0;
    await new Promise((r) => setTimeout(r, (flags.interval ?? 10) * 1000));
    if (!flags.json) out.stdout("");
  }
}

export function statusTable(rows: readonly StepRow[]): string {
  if (rows.length === 0) return "no steps";
  return table(
    ["STEP", "STATE", "DETAIL"],
    // A step's export, when one was asked for, on its own line under the step's conversion.
    rows.flatMap((r) => [
      [String(r.step), r.status.state, detail(r.status)],
      ...(r.export === null ? [] : [[String(r.step), `export ${r.export.state}`, exportDetail(r.export)]]),
    ]),
    new Set([0]),
  );
}

function exportDetail(s: ExportStatus): string {
  switch (s.state) {
    case "committed":
      return [
        s.destination,
        s.shards === null ? "" : `${s.shards} shards`,
        s.bytes === null ? "" : formatBytes(s.bytes),
        s.seconds === null ? "" : `in ${s.seconds} s`,
        s.finishedAt === null ? "" : `finished ${s.finishedAt}`,
      ]
        .filter(Boolean)
        .join(", ");
    case "running": {
      if (s.shards === null) return `${s.destination}: not begun (${s.phase ?? "converting first"}), ${s.elapsedSeconds} s so far`;
      const bytes = s.bytes === null ? formatBytes(s.bytesDone) : `${formatBytes(s.bytesDone)} of ${formatBytes(s.bytes)}`;
      return `${s.destination}: shards ${s.shardsDone}/${s.shards}, ${bytes}, ${s.elapsedSeconds} s so far${s.phase ? ` (${s.phase})` : ""}`;
    }
    case "failed": {
      const retry = s.retryable ? "running it again may help" : "running it again cannot help";
      return `${s.destination}: ${s.phase ? `${s.phase}: ` : ""}${s.error}; ${retry}`;
    }
    case "cancelled":
      return `${s.destination}: ${s.execution}${s.finishedAt ? ` at ${s.finishedAt}` : ""}`;
    case "pruned":
      return `${s.destination}: exported once, since removed by the exports' retention`;
  }
}

function detail(s: StepStatus): string {
  switch (s.state) {
    case "converted":
      return [
        s.bytes === null ? "" : formatBytes(s.bytes),
        s.seconds === null ? "" : `in ${s.seconds} s`,
        s.finishedAt === null ? "" : `finished ${s.finishedAt}`,
      ]
        .filter(Boolean)
        .join(", ");
    case "running": {
      if (s.executionState === "QUEUED") return "queued in the Workflows backlog, not begun";
      const groups = s.groups === null ? "planning" : `groups ${s.groupsDone}/${s.groups}`;
      const bytes = s.bytes === null ? formatBytes(s.bytesDone) : `${formatBytes(s.bytesDone)} of ${formatBytes(s.bytes)}`;
      const jobs = s.jobs.map((j) => `${j.name.split("/").at(-1)}: ${j.running} running, ${j.succeeded}/${j.taskCount} done`);
      return [`${groups}, ${bytes}, ${s.elapsedSeconds} s so far${s.phase ? ` (${s.phase})` : ""}`, ...jobs].join("; ");
    }
    case "failed": {
      const where = s.phase === null ? "" : s.group === null ? `${s.phase}: ` : `group ${s.group} (${s.phase}): `;
      const retry = s.retryable ? "running it again may help" : "running it again cannot help";
      // An export alone's error is on its export line, right below.
      if (s.exportOnly) return `export alone, not converted: ${s.phase ?? "the run"} failed (below); ${retry}`;
      return `${where}${s.error}; ${retry}${s.logUri ? `; logs ${s.logUri}` : ""}`;
    }
    case "cancelled":
      return s.exportOnly
        ? `export alone, not converted: ${s.execution}${s.finishedAt ? ` at ${s.finishedAt}` : ""}; \`orbax2reg cloud start --export FOLDER --export-only\` resumes it`
        : `${s.execution}${s.finishedAt ? ` at ${s.finishedAt}` : ""}; \`orbax2reg cloud start\` resumes it`;
    case "exporting":
      return s.executionState === "QUEUED"
        ? "export alone, not converted: queued in the Workflows backlog, not begun"
        : `export alone, not converted: ${s.execution.split("/").at(-1)}, ${s.elapsedSeconds} s so far`;
    case "exported":
      return `export alone, not converted: ${s.execution.split("/").at(-1)}${s.finishedAt ? `, finished ${s.finishedAt}` : ""}`;
    case "claimed":
      return s.expired ? `claimed at ${s.claimedAt}, never started (the claim has expired)` : `claimed at ${s.claimedAt}, starting`;
    case "not-converted":
      return s.reason;
  }
}

export interface StartFlags extends FleetFlags {
  readonly destination?: string;
  readonly force?: boolean;
  readonly paramsOnly?: boolean;
  /** --export: the export's folder; --export-only: no conversion; --export-tasks. */
  readonly export?: string;
  readonly exportOnly?: boolean;
  readonly exportTasks?: number;
}

/** `orbax2reg cloud start <step-dir>`: exactly the argument the console takes, claimed as the function claims. */
export async function runCloudStart(stepDir: string, flags: StartFlags, out: Output): Promise<number> {
  const trimmed = stepDir.replace(/\/+$/, "");
  const name = trimmed.slice(trimmed.lastIndexOf("/") + 1);
  const step = parseStepName(name);
  if (step === undefined || !trimmed.startsWith("gs://")) {
    throw new UsageError(`expected gs://BUCKET/PATH/step_XXXXXXXX (an Orbax step directory), got ${JSON.stringify(stepDir)}`);
  }
  if (flags.export === undefined && (flags.exportOnly || flags.exportTasks !== undefined))
    throw new UsageError("--export-only and --export-tasks need --export <folder>: where the export goes");
  const deps = await fleetDeps(flags, out);
  const root = parseRoot(trimmed.slice(0, trimmed.length - name.length - 1));
  const where = locate(root, step, deps.destinationTemplate);
  const options = { ...(flags.force ? { force: true } : {}), ...(flags.paramsOnly ? { params_only: true } : {}) };
  const argument = {
    source: where.source,
    destination: flags.destination?.replace(/\/+$/, "") ?? where.destination,
    step,
    groups: deps.groups,
    ...(Object.keys(options).length > 0 ? { options } : {}),
    ...(flags.exportOnly ? { convert: false } : {}),
    ...(flags.export === undefined
      ? {}
      : { export: { destination: flags.export, ...(flags.exportTasks !== undefined ? { tasks: flags.exportTasks } : {}) } }),
  };
  // The plan job checks the rest of the argument; the export's folder is checked here too, before anything is claimed.
  if (argument.export !== undefined) parseWorkflowArgument(argument, deps.groups);
  const outcome = await startByHand({ argument }, deps);
  if (outcome.kind === "refused") throw new UsageError(`the workflow refused to start: ${outcome.message}`);
  if (flags.json) out.stdout(JSON.stringify({ step, outcome: outcome.kind, execution: outcome.execution, argument }, null, 2));
  else out.stdout(`${outcome.kind === "started" ? "started" : "already running (recorded)"}: step ${step}: ${outcome.execution}`);
  return 0;
}

export interface BackfillFlags extends FleetFlags {
  readonly from?: number;
  readonly to?: number;
  readonly every?: number;
  readonly maxRunning?: number;
  readonly poll?: number;
  readonly dryRun?: boolean;
  /** --export: exports instead of conversions; --export-steps: these steps instead of hf_export's. */
  readonly export?: boolean;
  readonly exportSteps?: string;
}

/**
 * The export rule backfill --export follows: the deployed function's own settings (ORBAX2REG_EXPORT_*, read by the
 * function's parser: the same steps, folder template and settings the trigger would have used).
 */
function backfillExport(flags: BackfillFlags): BackfillExport | undefined {
  if (!flags.export) {
    if (flags.exportSteps !== undefined) throw new UsageError("--export-steps needs --export");
    return undefined;
  }
  const rule = exportFromEnv(process.env);
  if (rule.export === undefined || rule.exportSettings === undefined)
    throw new UsageError(
      "--export needs the deployment's hf_export rule: set ORBAX2REG_EXPORT_DESTINATION_TEMPLATE (and ORBAX2REG_EXPORT_EVERY_N_STEPS or ORBAX2REG_EXPORT_STEPS, dtype, tokenizer...) as the trigger function has them",
    );
  let steps: number[] | undefined;
  if (flags.exportSteps !== undefined) {
    const parts = flags.exportSteps.split(",").map((s) => s.trim());
    if (parts.some((s) => !/^\d{1,8}$/.test(s)))
      throw new UsageError(`--export-steps takes step numbers separated by commas, got ${JSON.stringify(flags.exportSteps)}`);
    steps = parts.map(Number);
  }
  return {
    destinationTemplate: rule.export.destinationTemplate,
    ...(rule.export.everyNSteps === undefined ? {} : { everyNSteps: rule.export.everyNSteps }),
    ruleSteps: rule.export.steps,
    settings: rule.exportSettings,
    ...(steps === undefined ? {} : { steps }),
  };
}

/** `orbax2reg cloud backfill <checkpoint-root>`: prints each step as it is started or skipped. */
export async function runCloudBackfill(root: string, flags: BackfillFlags, out: Output): Promise<number> {
  const exported = backfillExport(flags);
  const deps = await fleetDeps(flags, out);
  const line = (e: BackfillEntry) =>
    `${String(e.step).padStart(8)}  ${e.action.padEnd(11)}  ${e.action === "started" ? e.execution : e.why}`;
  const entries = await backfill(
    root,
    {
      ...(flags.from !== undefined ? { from: flags.from } : {}),
      ...(flags.to !== undefined ? { to: flags.to } : {}),
      every: flags.every ?? 1,
      maxRunning: flags.maxRunning ?? 4,
      pollMs: (flags.poll ?? 15) * 1000,
      dryRun: flags.dryRun === true,
      groups: deps.groups,
      ...(exported === undefined ? {} : { export: exported }),
      onEntry: (e) => {
        if (!flags.json) out.stdout(line(e));
      },
    },
    deps,
  );
  const started = entries.filter((e) => e.action === "started").length;
  const planned = entries.filter((e) => e.action === "would-start").length;
  if (flags.json) out.stdout(JSON.stringify(entries, null, 2));
  else
    out.stdout(
      flags.dryRun
        ? `${planned} would start, ${entries.length - planned} skipped`
        : `${started} started, ${entries.length - started} skipped`,
    );
  return 0;
}

export interface CancelFlags extends FleetFlags {
  readonly step: number;
}

/** `orbax2reg cloud cancel <checkpoint-root> --step N`. */
export async function runCloudCancel(root: string, flags: CancelFlags, out: Output): Promise<number> {
  const deps = await fleetDeps(flags, out);
  const report = await cancelStep(root, flags.step, deps);
  if (flags.json) out.stdout(JSON.stringify(report, null, 2));
  else if (report.executions.length === 0) out.stdout(`step ${flags.step}: nothing running`);
  else {
    for (const e of report.executions) out.stdout(`cancelled ${e}`);
    for (const j of report.jobs) out.stdout(`cancelled job execution ${j}`);
    out.stdout(
      report.committed
        ? `step ${flags.step}: its index had already been written: the step is converted`
        : `step ${flags.step}: no index written; \`orbax2reg cloud start\` resumes from what was converted`,
    );
  }
  return 0;
}
