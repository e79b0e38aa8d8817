// The Cloud Function (2nd gen) behind the checkpoint bucket's finalize events. Thin: configuration comes
// from the environment (set by terraform/modules/orbax2reg/function.tf), the decisions are in
// src/cloud/trigger/handler.ts.
import { type CloudEvent, cloudEvent } from "@google-cloud/functions-framework";
import { pubsubPublisher } from "../src/cloud/api/events.js";
import { executionsClient, workflowsExecutions } from "../src/cloud/api/executions.js";
import { jsonLogger } from "../src/cloud/api/log.js";
import { triggerConfigFromEnv } from "../src/cloud/trigger/config.js";
import { handleFinalized, type TriggerDeps } from "../src/cloud/trigger/handler.js";
import { failureLine, failureVerdict } from "../src/cloud/trigger/severity.js";
import { ConfigError, classify } from "../src/errors.js";
import { openStore } from "../src/store/open.js";

const log = jsonLogger({ component: "orbax2reg-trigger" });

/** The instance's configuration, read once: a value, or the error saying which variable is wrong. */
const config = (() => {
  try {
    return triggerConfigFromEnv(process.env);
  } catch (e) {
    if (e instanceof ConfigError) return e;
    throw e;
  }
})();
let configErrorLogged = false;

/**
 * Clients are created on first use and kept only once created: a failure here fails this event (the
 * platform redelivers it) without poisoning the instance for the next one.
 */
let deps: TriggerDeps | undefined;
async function realDeps(c: Exclude<typeof config, ConfigError>): Promise<TriggerDeps> {
  if (deps) return deps;
  const executions = workflowsExecutions(await executionsClient(process.env.ORBAX2REG_WORKFLOWS_ENDPOINT));
  deps = { config: c, openStore, executions, publish: await pubsubPublisher(), log };
  return deps;
}

cloudEvent("onCheckpointFinalized", async (event: CloudEvent<unknown>) => {
  if (config instanceof ConfigError) {
    // Redelivery cannot fix a configuration error, only a redeploy can: say so once per instance (at ERROR, which the
    // trigger-side alert sees), acknowledge every event.
    if (!configErrorLogged) {
      log.error(`misconfigured, events are acknowledged and ignored until redeployed: ${config.message}`, {
        variable: config.variable,
        value: config.value ?? null,
      });
      configErrorLogged = true;
    }
    return;
  }
  try {
    await handleFinalized({ id: event.id, data: event.data }, await realDeps(config));
  } catch (e) {
    // One line saying what failed and whether a retry can help. A function that fails is retried by its
    // Eventarc trigger (RETRY_POLICY_RETRY), with backoff, for up to 24 h: so only what a retry can help
    // throws; anything else (the event, or what it names, is at fault) is acknowledged by returning, or it
    // would fail the same way for a day (https://cloud.google.com/functions/docs/writing/retries,
    // https://cloud.google.com/eventarc/docs/retry-events).
    // Only a dropped event, or one failing for long, is an ERROR: the trigger-side alert fires on those lines
    // (src/cloud/trigger/severity.ts).
    const { kind: errorKind, retryable, line } = classify(e);
    const verdict = failureVerdict(retryable, event.time, Date.now());
    log.log(verdict.severity, failureLine(verdict, line), {
      eventId: event.id ?? null,
      errorKind,
      retryable,
      outcome: verdict.outcome,
      eventAgeSeconds: verdict.ageMs === null ? null : Math.round(verdict.ageMs / 1000),
    });
    if (retryable) throw e;
  }
});
