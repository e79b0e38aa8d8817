import { randomBytes } from "node:crypto";
import type { ConversionEvent } from "../cloud/api/events.js";
import { executionsClient, workflowsExecutions } from "../cloud/api/executions.js";
import { cloudQuotas } from "../cloud/api/quotas.js";
import { triggerDeliveryReader } from "../cloud/api/trigger-delivery.js";
import { type CheckReport, postDeployCheck, type Stage } from "../cloud/ops/check.js";
import { checkDelivery } from "../cloud/ops/check-delivery.js";
import { checkQuota, memoryMiB } from "../cloud/ops/check-quota.js";
import { resolveCloudSettings, resolveFanOutSettings } from "../cloud/ops/settings.js";
import { verify } from "../convert/verify.js";
import { CLAIM_LEASE_MARGIN_SECONDS } from "../defaults.js";
import { EXIT_CHECK_FAILED, UsageError } from "../errors.js";
import { openStore } from "../store/open.js";
import type { Output } from "./output.js";

export interface CheckFlags {
  readonly bucket: string;
  readonly prefix?: string;
  readonly workflow?: string;
  readonly project?: string;
  readonly region?: string;
  readonly eventsTopic?: string;
  readonly timeout: number;
  readonly keep?: boolean;
  readonly json?: boolean;
}

/**
 * `orbax2reg cloud check`: see src/cloud/ops/check.ts. Exit 0 when every stage passed, else 4 (EXIT_CHECK_FAILED,
 * as `verify`'s difference): the check ran and found the deployment wanting; 1 stays for a failure of the tool.
 */
export async function runCloudCheck(flags: CheckFlags, out: Output): Promise<number> {
  if (flags.bucket.startsWith("gs://") || flags.bucket.includes("/")) {
    throw new UsageError(
      `--bucket takes a bucket name (no gs://, no path; the path goes in --prefix), got ${JSON.stringify(flags.bucket)}`,
    );
  }
  const settings = resolveCloudSettings(flags, process.env);
  const executions = workflowsExecutions(await executionsClient(process.env.ORBAX2REG_WORKFLOWS_ENDPOINT));
  // The workflow's id names the project and region the jobs run in: the quota that applies is that region's.
  const [, project, region] = /^projects\/([^/]+)\/locations\/([^/]+)\//.exec(settings.workflow) as RegExpExecArray;
  const fanOut = resolveFanOutSettings(process.env);
  const report: CheckReport = await postDeployCheck(
    {
      bucket: flags.bucket,
      prefix: flags.prefix ?? "",
      workflow: settings.workflow,
      eventsTopic: settings.eventsTopic,
      keep: flags.keep === true,
      triggerTimeoutMs: Math.min(300, flags.timeout) * 1000,
      convertTimeoutMs: flags.timeout * 1000,
      destinationTemplate: settings.destinationTemplate,
      ...(settings.exportDestinationTemplate === undefined ? {} : { exportTemplate: settings.exportDestinationTemplate }),
    },
    {
      executions,
      openStore,
      uniformAccess: async (bucket) => {
        const { GcsStore } = await import("../store/gcs.js");
        return new GcsStore(bucket, "").uniformBucketLevelAccess();
      },
      subscribe,
      verify: (source, regular) => verify(source, regular),
      checkQuota: async () =>
        checkQuota(await cloudQuotas(process.env.ORBAX2REG_CLOUDQUOTAS_ENDPOINT), project as string, region as string, {
          parallelGroups: Math.min(settings.groups, fanOut.maxParallelGroups),
          // The trigger starts every conversion with the workflow's default, one task per group.
          tasksPerGroup: 1,
          cpu: fanOut.groupCpu,
          memoryMiB: memoryMiB(fanOut.groupMemory),
          function: { instances: fanOut.functionMaxInstances, cpu: fanOut.functionCpu, memoryMiB: memoryMiB(fanOut.functionMemory) },
        }),
      checkDelivery: async () => {
        const trigger = settings.eventTrigger;
        if (trigger === undefined)
          return "not read: the function's trigger is not known (terraform output event_trigger, or ORBAX2REG_EVENT_TRIGGER)";
        const read = await triggerDeliveryReader({
          eventarc: process.env.ORBAX2REG_EVENTARC_ENDPOINT || undefined,
          pubsub: process.env.ORBAX2REG_PUBSUB_REST_ENDPOINT || undefined,
        });
        return checkDelivery(() => read(trigger), settings.claimLeaseSeconds - CLAIM_LEASE_MARGIN_SECONDS, {
          now: Date.now,
          sleep: (ms) => new Promise((r) => setTimeout(r, ms)),
          note: (line) => {
            if (!flags.json) out.stdout(line);
          },
        });
      },
      onStage: (s: Stage) => {
        if (!flags.json)
          out.stdout(
            `${s.skipped ? "skip" : s.ok ? "ok  " : "FAIL"} ${s.stage.padEnd(8)} ${s.seconds.toFixed(1).padStart(6)} s  ${s.detail}`,
          );
      },
    },
  );
  if (flags.json) out.stdout(JSON.stringify(report, null, 2));
  else {
    const exported = report.stages.some((s) => s.stage === "export-verify" && s.ok);
    out.stdout(
      report.ok
        ? `the pipeline converted and verified a checkpoint${exported ? ", and exported one as export-hf does" : ""}: deployment OK`
        : "deployment check FAILED",
    );
  }
  return report.ok ? 0 : EXIT_CHECK_FAILED;
}

/** A temporary subscription to the events topic, deleted on close. */
async function subscribe(topic: string) {
  const { PubSub } = await import("@google-cloud/pubsub");
  const pubsub = new PubSub({ projectId: topic.split("/")[1] });
  const [subscription] = await pubsub.topic(topic).createSubscription(`orbax2reg-check-${randomBytes(4).toString("hex")}`, {
    // Deleted by close; should the check die, Pub/Sub removes it after a day without use.
    expirationPolicy: { ttl: { seconds: 86_400 } },
  });
  const events: ConversionEvent[] = [];
  subscription.on("message", (m) => {
    try {
      events.push(JSON.parse(m.data.toString()) as ConversionEvent);
    } finally {
      m.ack();
    }
  });
  subscription.on("error", () => {});
  return {
    events,
    close: async () => {
      await subscription.close();
      await subscription.delete();
      await pubsub.close();
    },
  };
}
