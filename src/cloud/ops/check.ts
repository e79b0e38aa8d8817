import { randomBytes } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { VerifyResult } from "../../convert/verify.js";
import { DEFAULT_DESTINATION_TEMPLATE } from "../../defaults.js";
import { stepDirName } from "../../orbax/step-name.js";
import { deleteSeen, type ObjectInfo, type Store } from "../../store/store.js";
import type { ConversionEvent } from "../api/events.js";
import { type ExecutionRef, type Executions, executionLabels } from "../api/executions.js";
import { CHECK_ROOT_PREFIX } from "../trigger/classify.js";
import {
  compareWithLocalExport,
  EXPORT_STEP,
  type ExportCheckPlan,
  exportCheckPlan,
  startExportRun,
  uploadExample,
} from "./check-export.js";
import { proveLabelFilter } from "./check-filter.js";
import type { QuotaVerdict } from "./check-quota.js";

/**
 * `orbax2reg cloud check`: the last step of a deployment. Uploads a tiny real Orbax checkpoint under a
 * watched prefix (commit marker last, as Orbax writes it), waits for the pipeline to convert it (the
 * execution the trigger starts, and its conversion.* event), verifies the result against the source,
 * and removes what it wrote. Each stage is reported with its time as it ends. First of all it checks that the
 * checkpoint bucket (and later a separate destination bucket) has uniform bucket-level access: the function's and
 * the jobs' write grants are IAM conditions, which Cloud Storage honours only on such buckets
 * (https://cloud.google.com/storage/docs/uniform-bucket-level-access, terraform/README.md, "Where the jobs may write").
 * Before it uploads anything it says whether the configured fan-out fits the region's Cloud Run quota
 * (src/cloud/ops/check-quota.ts), and once the trigger has started the execution it proves the executions filter
 * the trigger relies on against the real API's answer (src/cloud/ops/check-filter.ts); a failure of either is
 * reported and the check goes on (and fails). Before the upload it also reads how events reach the function (the
 * trigger's age and its subscription's acknowledgement deadline, src/cloud/ops/check-delivery.ts), waiting for a
 * trigger younger than two minutes; and when the destination is in the watched bucket it says what that costs.
 */
export type StageName =
  | "access"
  | "quota"
  | "delivery"
  | "upload"
  | "trigger"
  | "filter"
  | "convert"
  | "event"
  | "verify"
  | "layout"
  | "export"
  | "export-event"
  | "export-verify"
  | "cleanup";

export interface Stage {
  readonly stage: StageName;
  readonly ok: boolean;
  readonly seconds: number;
  readonly detail: string;
  /** Not run, and why (detail): what it checks is not deployed. Counts as passed. */
  readonly skipped?: true;
}

export interface CheckReport {
  readonly ok: boolean;
  readonly source: string;
  readonly destination: string | null;
  readonly execution: string | null;
  readonly stages: Stage[];
}

export interface CloudCheckOptions {
  readonly bucket: string;
  /** A watched prefix (one of checkpoint_prefixes); "" for the whole bucket. */
  readonly prefix: string;
  readonly workflow: string;
  readonly eventsTopic: string | undefined;
  /** Keep the uploaded checkpoint and its conversion. */
  readonly keep: boolean;
  /** How long the trigger may take to start an execution (function cold start, event delivery). */
  readonly triggerTimeoutMs: number;
  /** How long the conversion may take once started. */
  readonly convertTimeoutMs: number;
  readonly pollMs?: number;
  /**
   * hf_export's destination_template (terraform output hf_export_destination_template), undefined when hf_export is
   * off: then the export stages are skipped, saying so. With it, the check also runs an export-only run of the bundled
   * fuji example (src/cloud/ops/check-export.ts), its regular work directory where `destinationTemplate` says.
   */
  readonly exportTemplate?: string;
  readonly destinationTemplate?: string;
}

export interface EventSubscription {
  /** Events received so far. */
  readonly events: ConversionEvent[];
  close(): Promise<void>;
}

export interface CheckDeps {
  readonly executions: Executions;
  openStore(location: string): Promise<Store>;
  /** Whether the bucket has uniform bucket-level access; undefined when its metadata does not say. */
  uniformAccess(bucket: string): Promise<boolean | undefined>;
  /** Subscribes to the events topic (a temporary subscription, deleted by close). */
  subscribe(topic: string): Promise<EventSubscription>;
  verify(orbaxStep: string, regularStep: string): Promise<VerifyResult>;
  /** The quota stage: whether the configured fan-out fits (null: cannot tell, reported as passed with why). */
  checkQuota?(): Promise<QuotaVerdict>;
  /** The delivery stage (src/cloud/ops/check-delivery.ts): its line, or throws what is wrong. */
  checkDelivery?(): Promise<string>;
  onStage(stage: Stage): void;
  readonly now?: () => number;
}

/** The example step every check uploads: the bundled tiny checkpoint (15 arrays). */
export function bundledCheckpoint(): string {
  return bundled("test/fixtures/orbax-axlearn/tiny/step_00000100");
}

/** The step the export check uploads: the bundled fuji example (`orbax2reg example fuji`), saved by AXLearn. */
export function bundledFujiStep(): string {
  return bundled("test/fixtures/orbax-axlearn/fuji-v2-tiny/step_00001000");
}

function bundled(relative: string): string {
  // Walk up from this file (src/cloud or dist/src/cloud) to the package root.
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "package.json")) || !readFileSync(join(dir, "package.json"), "utf8").includes('"name": "orbax2reg"')) {
    const up = dirname(dir);
    if (up === dir) throw new Error("cannot find the orbax2reg package root for the bundled checkpoint");
    dir = up;
  }
  return join(dir, relative);
}

const STEP_DIR = "step_00000100";
const STEP = 100;
const COMMIT_MARKER = "commit_success.txt";

class StageFailed extends Error {}

export async function postDeployCheck(o: CloudCheckOptions, deps: CheckDeps): Promise<CheckReport> {
  const now = deps.now ?? Date.now;
  const poll = o.pollMs ?? 2_000;
  const prefix = o.prefix.replace(/^\/+|\/+$/g, "");
  // The trigger knows this name: it converts a step here whatever the step rules say and never exports it.
  const root = `${prefix === "" ? "" : `${prefix}/`}${CHECK_ROOT_PREFIX}${randomBytes(4).toString("hex")}`;
  const source = `gs://${o.bucket}/${root}/${STEP_DIR}`;
  const stages: Stage[] = [];
  let execution: ExecutionRef | undefined;
  let destination: string | null = null;
  let subscription: EventSubscription | undefined;
  /** What the export-only run wrote outside the check's root, for the clean-up (nothing when it is all inside). */
  const exportWrote: string[] = [];

  /** A stage; a failed one ends the check, unless `goOn` (its failure is reported, and fails the check, all the same). */
  const skip = (stage: StageName, detail: string) => {
    const s: Stage = { stage, ok: true, seconds: 0, detail, skipped: true };
    stages.push(s);
    deps.onStage(s);
  };
  const run = async (stage: StageName, body: () => Promise<string>, goOn = false): Promise<void> => {
    const started = now();
    let ok = true;
    let detail: string;
    try {
      detail = await body();
    } catch (e) {
      ok = false;
      detail = (e as Error).message;
    }
    const s: Stage = { stage, ok, seconds: (now() - started) / 1000, detail };
    stages.push(s);
    deps.onStage(s);
    if (!s.ok && !goOn) throw new StageFailed(s.detail);
  };
  const waitFor = async <T>(what: string, timeoutMs: number, probe: () => Promise<T | undefined>): Promise<T> => {
    const deadline = now() + timeoutMs;
    for (;;) {
      const v = await probe();
      if (v !== undefined) return v;
      if (now() >= deadline) throw new Error(`${what} within ${Math.round(timeoutMs / 1000)} s`);
      await new Promise((r) => setTimeout(r, poll));
    }
  };

  const access = async (bucket: string): Promise<string> => {
    const uniform = await deps.uniformAccess(bucket);
    if (uniform === false)
      throw new Error(
        `gs://${bucket} has no uniform bucket-level access: the pipeline's write grants are IAM conditions, which Cloud Storage honours only on such buckets; enable it (gcloud storage buckets update gs://${bucket} --uniform-bucket-level-access)`,
      );
    return uniform === undefined
      ? `gs://${bucket}: its metadata does not say (no iamConfiguration: not Cloud Storage itself?)`
      : `gs://${bucket}: uniform bucket-level access enabled`;
  };

  /** An export-only run of the bundled fuji example, its event, and its files against the same export made here. */
  const exportStages = async (template: string): Promise<void> => {
    const inRoot = (location: string) => location.startsWith(`gs://${o.bucket}/${root}/`);
    let exported: ExecutionRef | undefined;
    let planned: ExportCheckPlan | undefined;
    await run("export", async () => {
      // A template that puts the export inside the source is refused here, as a failed stage.
      const plan = exportCheckPlan(o.bucket, root, o.destinationTemplate ?? DEFAULT_DESTINATION_TEMPLATE, template);
      planned = plan;
      const uploaded = await uploadExample(await deps.openStore(bundledFujiStep()), await deps.openStore(plan.source));
      // Cleaned up whatever happens next: the export's folder, the step's work directory (progress records) and the
      // run's directory in the regular root, each only where it is not under the check's root already.
      const started = await startExportRun(deps.executions, o.workflow, plan);
      exported = started;
      const id = started.name.split("/").at(-1) as string;
      for (const w of [
        plan.exportTo,
        `${plan.destinationRoot}/${stepDirName(EXPORT_STEP)}`,
        `${plan.destinationRoot}/.orbax2reg/executions/${id}`,
      ])
        if (!inRoot(w)) exportWrote.push(w);
      const done = await waitFor(`execution ${started.name} still running`, o.convertTimeoutMs, async () => {
        const e = await deps.executions.get(started.name);
        return e.state === "ACTIVE" || e.state === "QUEUED" ? undefined : e;
      });
      if (done.state !== "SUCCEEDED") throw new Error(`execution ${started.name} ended ${done.state}: ${errorLine(done.error)}`);
      return `${plan.source} (${uploaded} objects, no commit marker) exported alone by ${started.name}: ${done.state} into ${plan.exportTo}`;
    });
    const plan = planned as ExportCheckPlan;
    if (subscription) {
      const events = subscription.events;
      await run("export-event", async () => {
        const e = await waitFor(`no export.succeeded event for ${plan.exportTo} on ${o.eventsTopic}`, 60_000, async () =>
          events.find((x) => x.source === plan.source && x.type.startsWith("export.")),
        );
        if (e.type !== "export.succeeded") throw new Error(`${e.type}: ${e.error ?? ""}`);
        return `${e.type} (${e.bytes} bytes) from ${(exported as ExecutionRef).name}`;
      });
    }
    await run("export-verify", async () => compareWithLocalExport(bundledFujiStep(), await deps.openStore(plan.exportTo), deps.openStore));
  };

  try {
    await run("access", () => access(o.bucket));
    if (deps.checkQuota) {
      const verdict = deps.checkQuota;
      await run(
        "quota",
        async () => {
          const v = await verdict();
          if (v.fits === false) throw new Error(v.detail);
          return v.detail;
        },
        true,
      );
    }
    if (deps.checkDelivery) await run("delivery", deps.checkDelivery, true);
    // Subscribe first so that no event is missed.
    if (o.eventsTopic) subscription = await deps.subscribe(o.eventsTopic);
    const uploadedAt = now();
    await run("upload", async () => {
      const local = await deps.openStore(bundledCheckpoint());
      const remote = await deps.openStore(source);
      const keys: string[] = [];
      for await (const f of local.list("")) keys.push(f.key);
      const data = keys.filter((k) => k !== COMMIT_MARKER);
      await Promise.all(data.map(async (k) => remote.write(k, await local.read(k))));
      // The commit marker last: it is the event the trigger acts on.
      await remote.write(COMMIT_MARKER, await local.read(COMMIT_MARKER));
      return `${source} (${keys.length} objects, ${COMMIT_MARKER} last)`;
    });
    await run("trigger", async () => {
      const labels = executionLabels(source, STEP);
      const found = await waitFor(
        `no execution of ${o.workflow} started for ${source} (labels step=${labels.step}, source=${labels.source}): is "${prefix}" one of checkpoint_prefixes, and is the function deployed? Read its logs`,
        o.triggerTimeoutMs,
        async () => (await deps.executions.find(o.workflow, labels))[0],
      );
      // The listing's BASIC view has no argument: the execution itself (FULL view) names the destination.
      execution = await deps.executions.get(found.name);
      destination = `${(JSON.parse(execution.argument) as { destination: string }).destination}/${STEP_DIR}`;
      return `execution ${execution.name}`;
    });
    const destinationBucket = /^gs:\/\/([^/]+)/.exec(destination ?? "")?.[1];
    if (destinationBucket !== undefined && destinationBucket !== o.bucket) await run("access", () => access(destinationBucket));
    await run(
      "filter",
      () =>
        proveLabelFilter(deps.executions, o.workflow, executionLabels(source, STEP), (execution as ExecutionRef).name, {
          // Minutes either side, for the clock of this machine against the API's.
          before: new Date(uploadedAt - 5 * 60_000).toISOString(),
          after: new Date(now() + 10 * 60_000).toISOString(),
        }),
      true,
    );
    await run("convert", async () => {
      const name = (execution as ExecutionRef).name;
      const done = await waitFor(`execution ${name} still running`, o.convertTimeoutMs, async () => {
        const e = await deps.executions.get(name);
        return e.state === "ACTIVE" || e.state === "QUEUED" ? undefined : e;
      });
      if (done.state !== "SUCCEEDED") throw new Error(`execution ${name} ended ${done.state}: ${errorLine(done.error)}`);
      return `${done.state} into ${destination}`;
    });
    if (subscription) {
      const events = subscription.events;
      await run("event", async () => {
        const e = await waitFor(`no conversion.succeeded event for ${source} on ${o.eventsTopic}`, 60_000, async () =>
          events.find((x) => x.source === source && x.type !== "conversion.requested"),
        );
        if (e.type !== "conversion.succeeded") throw new Error(`${e.type}: ${e.error ?? ""}`);
        return `${e.type} (${e.arrays} arrays, ${e.bytes} bytes)`;
      });
    }
    await run("verify", async () => {
      const r = await deps.verify(source, destination as string);
      const failed = r.checks.find((c) => !c.ok);
      if (failed) throw new Error(`${r.passed} passed, ${r.failed} failed; first: ${failed.name}: ${failed.detail ?? ""}`);
      return `${r.passed} passed, ${r.failed} failed`;
    });
    if (destination !== null && destinationBucket === o.bucket) {
      const written = destination as string;
      await run("layout", async () => {
        const store = await deps.openStore(written);
        let objects = 0;
        for await (const _ of store.list("")) objects++;
        return (
          `the destination shares the watched bucket gs://${o.bucket}: every object a conversion writes there is one more event ` +
          `for the function (${objects} for this check's step; about one per chunk: ~100,000 invocations and ~22 vCPU-seconds ` +
          `for a 100,000-chunk step, docs/operations.md "Event cost"); set destination_bucket to write elsewhere`
        );
      });
    }
    if (o.exportTemplate === undefined)
      skip(
        "export",
        "skipped: hf_export is off (no terraform output hf_export_destination_template, no ORBAX2REG_EXPORT_DESTINATION_TEMPLATE)",
      );
    else await exportStages(o.exportTemplate);
  } catch (e) {
    if (!(e instanceof StageFailed)) throw e;
  } finally {
    await subscription?.close().catch(() => {});
    if (!o.keep) {
      await run("cleanup", async () => {
        let removed = 0;
        for (const location of [`gs://${o.bucket}/${root}`, destination, ...exportWrote]) {
          if (location === null) continue;
          const store = await deps.openStore(location);
          const listed: ObjectInfo[] = [];
          for await (const f of store.list("")) listed.push(f);
          // Each delete names the generation listed: only then may it be retried safely (deleteSeen).
          await Promise.all(listed.map((f) => deleteSeen(store, f)));
          removed += listed.length;
        }
        return `${removed} objects removed`;
      }).catch(() => {});
    }
  }
  return {
    ok: stages.every((s) => s.ok),
    source,
    destination,
    execution: (execution as ExecutionRef | undefined)?.name ?? null,
    stages,
  };
}

function errorLine(payload: string | undefined): string {
  if (!payload) return "no error payload";
  try {
    const p = JSON.parse(payload) as { message?: unknown };
    return typeof p.message === "string" ? p.message : payload;
  } catch {
    return payload;
  }
}
