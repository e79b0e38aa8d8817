import type { TriggerDelivery } from "../api/trigger-delivery.js";

/**
 * `cloud check`'s `delivery` stage: how events reach the function, read before anything is uploaded.
 *
 * - A trigger younger than two minutes may not deliver yet: "Newly created triggers can take up to two minutes to
 *   become operational" (https://cloud.google.com/eventarc/docs/issues). Right after a first apply the check would
 *   then fail for nothing, so it waits until the trigger is two minutes old (at most that long, saying so first).
 * - The acknowledgement deadline of the trigger's subscription is the time the function has to answer a delivery
 *   (src/cloud/api/trigger-delivery.ts). Google's pages do not say what Cloud Functions sets it to for a 2nd gen
 *   function's trigger (Pub/Sub's default is 10 s; hashicorp/terraform-provider-google#17701 reports 10 s for
 *   Eventarc triggers), so the check reads it. The function's slowest path (claim, a peer's wait, the workflow start)
 *   ends at its own deadline, 3/4 of its timeout, plus the call in flight, and Cloud Run cuts any request at the
 *   timeout: an ack deadline at least the function's timeout takes every answer the function can give. A shorter one
 *   fails the stage with the command that raises it (the retry-events page's way: update the trigger's subscription,
 *   https://cloud.google.com/eventarc/docs/retry-events); the check goes on.
 * - The backlog alert and the dashboard's backlog charts (terraform/modules/orbax2reg/alerts.tf, dashboard.tf) cannot
 *   name the subscription (Eventarc creates it; the provider does not expose it), so they select it by the prefix
 *   eventarc-REGION-TRIGGER_ID-sub-. Google's pages have named subscriptions that way, but promise no more than
 *   eventarc-REGION- (the trigger's transport.pubsub.subscription is only "created and managed by Eventarc":
 *   https://cloud.google.com/eventarc/docs/reference/rest/v1/projects.locations.triggers). A subscription named
 *   otherwise would leave the alert silent, with no sign of it: the stage fails, naming both.
 */
export const TRIGGER_WARM_UP_MS = 120_000;

/** The prefix alerts.tf's `trigger_subscription_prefix` selects the trigger's subscription by, from the trigger's name. */
export function triggerSubscriptionPrefix(trigger: string): string | undefined {
  const m = /^projects\/[^/]+\/locations\/([^/]+)\/triggers\/([^/]+)$/.exec(trigger);
  return m ? `eventarc-${m[1]}-${m[2]}-sub-` : undefined;
}

export interface DeliveryDeps {
  readonly now: () => number;
  readonly sleep: (ms: number) => Promise<void>;
  /** Says something at once (before a wait). */
  readonly note: (line: string) => void;
}

export async function checkDelivery(
  read: () => Promise<TriggerDelivery>,
  functionTimeoutSeconds: number,
  deps: DeliveryDeps,
): Promise<string> {
  const d = await read();
  const id = d.trigger.split("/").pop();
  const parts: string[] = [];
  const created = d.createTime === undefined ? Number.NaN : Date.parse(d.createTime);
  if (Number.isNaN(created)) parts.push(`trigger ${id} (no createTime)`);
  else {
    const age = deps.now() - created;
    const wait = Math.min(TRIGGER_WARM_UP_MS, TRIGGER_WARM_UP_MS - age);
    if (wait > 0) {
      deps.note(
        `     delivery         the trigger ${id} was created ${seconds(Math.max(0, age))} ago; new Eventarc triggers can take up to two minutes to become operational: waiting ${seconds(wait)}`,
      );
      await deps.sleep(wait);
      parts.push(
        `trigger ${id} created ${seconds(Math.max(0, age))} before the check: waited ${seconds(wait)} for it to be two minutes old`,
      );
    } else parts.push(`trigger ${id} created ${ago(age)}`);
  }
  if (d.subscription === undefined)
    throw new Error(`${parts.join("; ")}; the trigger names no Pub/Sub subscription yet: run the check again in a few minutes`);
  const sub = d.subscription.split("/").pop() ?? "";
  const prefix = triggerSubscriptionPrefix(d.trigger);
  if (prefix === undefined || !sub.startsWith(prefix)) {
    throw new Error(
      `${parts.join("; ")}; subscription ${sub} does not start with ${prefix ?? "eventarc-REGION-TRIGGER_ID-sub-"}, the prefix the backlog alert and the dashboard's backlog charts select the trigger's subscription by: they would see none of its undelivered events. Eventarc has named it differently from what the module expects (terraform/modules/orbax2reg/alerts.tf, trigger_subscription_prefix): report it, and watch the subscription by hand meanwhile (gcloud pubsub subscriptions describe ${d.subscription})`,
    );
  }
  // Pub/Sub: "If this parameter is 0, a default value of 10 seconds is used."
  const ack = d.ackDeadlineSeconds === undefined || d.ackDeadlineSeconds === 0 ? 10 : d.ackDeadlineSeconds;
  const dead = d.deadLetterTopic
    ? `dead-letter topic ${d.deadLetterTopic} after ${d.maxDeliveryAttempts ?? 5} attempts`
    : "no dead-letter topic (Eventarc discards an event 24 h after it was sent)";
  if (ack < functionTimeoutSeconds) {
    throw new Error(
      `${parts.join("; ")}; subscription ${sub}: ack deadline ${ack} s is shorter than the function's timeout of ${functionTimeoutSeconds} s: an answer after ${ack} s is not taken and the event is sent again; raise it: gcloud pubsub subscriptions update ${d.subscription} --ack-deadline=${Math.min(600, functionTimeoutSeconds)} (or deploy with function_timeout_seconds = ${ack})`,
    );
  }
  parts.push(`subscription ${sub}: ack deadline ${ack} s, at least the function's timeout of ${functionTimeoutSeconds} s; ${dead}`);
  return parts.join("; ");
}

const seconds = (ms: number) => `${Math.round(ms / 1000)} s`;
function ago(ms: number): string {
  const s = ms / 1000;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 172_800) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86_400)} days ago`;
}
