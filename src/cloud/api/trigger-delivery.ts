import { CloudApiError } from "../../errors.js";
import { retryCall } from "./grpc.js";
import { describeFailure, RETRY, type RequestClient, statusOf } from "./quotas.js";

/**
 * How events reach the function, as `orbax2reg cloud check` reads it: the function's Eventarc trigger
 * (`GET https://eventarc.googleapis.com/v1/{name=projects/*\/locations/*\/triggers/*}`: its createTime and
 * transport.pubsub.subscription, "the name of the Pub/Sub subscription created and managed by Eventarc as a transport
 * for the event delivery"; https://cloud.google.com/eventarc/docs/reference/rest/v1/projects.locations.triggers) and
 * that subscription (`GET https://pubsub.googleapis.com/v1/{subscription=projects/*\/subscriptions/*}`: ackDeadlineSeconds,
 * deadLetterPolicy; https://cloud.google.com/pubsub/docs/reference/rest/v1/projects.subscriptions). A push
 * subscription's acknowledgement deadline is how long Pub/Sub waits for the function's answer (Subscription.
 * ackDeadlineSeconds: "For push delivery, this value is also used to set the request timeout for the call to the push
 * endpoint"; 10 s when unset, at most 600 s; same page), and Cloud Run applies it to an Eventarc delivery
 * (https://cloud.google.com/run/docs/configuring/request-timeout: "When triggering your service from Eventarc events
 * ... the timeout of these services apply"). The reads need eventarc.triggers.get and pubsub.subscriptions.get
 * (Eventarc Viewer, Pub/Sub Viewer). REST through google-auth-library, as src/cloud/api/quotas.ts.
 */
export interface TriggerDelivery {
  /** projects/P/locations/L/triggers/T */
  readonly trigger: string;
  /** RFC 3339, when the trigger was created. */
  readonly createTime: string | undefined;
  /** projects/P/subscriptions/S, undefined when the trigger names none (not yet provisioned). */
  readonly subscription: string | undefined;
  /** The subscription's acknowledgement deadline in seconds (Pub/Sub's default when unset: 10). */
  readonly ackDeadlineSeconds: number | undefined;
  readonly deadLetterTopic: string | undefined;
  readonly maxDeliveryAttempts: number | undefined;
}

export const EVENTARC_ENDPOINT = "https://eventarc.googleapis.com";
export const PUBSUB_ENDPOINT = "https://pubsub.googleapis.com";
const TIMEOUT_MS = 15_000;

/** `ORBAX2REG_EVENTARC_ENDPOINT` / `ORBAX2REG_PUBSUB_REST_ENDPOINT` (http://host:port) name local stand-ins, called without credentials. */
export async function triggerDeliveryReader(
  endpoints: { eventarc?: string | undefined; pubsub?: string | undefined } = {},
): Promise<(trigger: string) => Promise<TriggerDelivery>> {
  const { GoogleAuth, PassThroughClient } = await import("google-auth-library");
  const local = endpoints.eventarc !== undefined || endpoints.pubsub !== undefined;
  const client: RequestClient = local
    ? (new PassThroughClient() as unknown as RequestClient)
    : ((await new GoogleAuth({ scopes: ["https://www.googleapis.com/auth/cloud-platform"] }).getClient()) as unknown as RequestClient);
  const eventarc = (endpoints.eventarc ?? EVENTARC_ENDPOINT).replace(/\/+$/, "");
  const pubsub = (endpoints.pubsub ?? PUBSUB_ENDPOINT).replace(/\/+$/, "");
  return (trigger) => readTriggerDelivery(client, trigger, { eventarc, pubsub });
}

export async function readTriggerDelivery(
  client: RequestClient,
  trigger: string,
  base: { eventarc: string; pubsub: string },
): Promise<TriggerDelivery> {
  const get = async <T>(url: string): Promise<T> =>
    (
      await retryCall(() => client.request<T>({ url, method: "GET", timeout: TIMEOUT_MS, responseType: "json" }), RETRY).catch((e) => {
        throw new CloudApiError(`${url}: ${describeFailure(e)}`, statusOf(e));
      })
    ).data;
  const t = await get<{ createTime?: string; transport?: { pubsub?: { subscription?: string } } }>(`${base.eventarc}/v1/${trigger}`);
  const subscription = t.transport?.pubsub?.subscription || undefined;
  const s =
    subscription === undefined
      ? {}
      : await get<{ ackDeadlineSeconds?: number; deadLetterPolicy?: { deadLetterTopic?: string; maxDeliveryAttempts?: number } }>(
          `${base.pubsub}/v1/${subscription}`,
        );
  return {
    trigger,
    createTime: t.createTime,
    subscription,
    ackDeadlineSeconds: s.ackDeadlineSeconds,
    deadLetterTopic: s.deadLetterPolicy?.deadLetterTopic || undefined,
    maxDeliveryAttempts: s.deadLetterPolicy?.maxDeliveryAttempts,
  };
}
