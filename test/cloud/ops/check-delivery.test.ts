// `cloud check`'s delivery stage (src/cloud/ops/check-delivery.ts): before it uploads anything it reads the function's
// Eventarc trigger (its age) and the trigger's Pub/Sub subscription (its acknowledgement deadline, which is the time a
// push delivery has to be answered). A trigger younger than two minutes may not deliver yet
// (https://cloud.google.com/eventarc/docs/issues), so the check waits until it is two minutes old, saying so first.

import { PassThroughClient } from "google-auth-library";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { readTriggerDelivery, type TriggerDelivery } from "../../../src/cloud/api/trigger-delivery.js";
import { checkDelivery, TRIGGER_WARM_UP_MS, triggerSubscriptionPrefix } from "../../../src/cloud/ops/check-delivery.js";
import { startTriggerStandIn, type TriggerStandIn } from "../../helpers/eventarc-stand-in.js";

const TRIGGER = "projects/p/locations/us-central1/triggers/orbax2reg-on-checkpoint-123456";
const SUBSCRIPTION = "projects/p/subscriptions/eventarc-us-central1-orbax2reg-on-checkpoint-123456-sub-789";
const NOW = Date.parse("2026-12-05T00:00:00Z");

function delivery(over: Partial<TriggerDelivery> = {}): TriggerDelivery {
  return {
    trigger: TRIGGER,
    createTime: "2026-12-04T21:00:00Z",
    subscription: SUBSCRIPTION,
    ackDeadlineSeconds: 600,
    deadLetterTopic: undefined,
    maxDeliveryAttempts: undefined,
    ...over,
  };
}

async function run(d: TriggerDelivery, timeoutSeconds = 60) {
  const slept: number[] = [];
  const notes: string[] = [];
  let clock = NOW;
  const result = await checkDelivery(async () => d, timeoutSeconds, {
    now: () => clock,
    sleep: async (ms) => {
      slept.push(ms);
      clock += ms;
    },
    note: (line) => notes.push(line),
  }).then(
    (detail) => ({ ok: true, detail }),
    (e: Error) => ({ ok: false, detail: e.message }),
  );
  return { ...result, slept, notes };
}

describe("the delivery stage", () => {
  test("an old trigger whose subscription's ack deadline covers the function's timeout passes at once, saying both", async () => {
    const r = await run(delivery());
    expect(r).toMatchObject({ ok: true, slept: [], notes: [] });
    expect(r.detail).toBe(
      "trigger orbax2reg-on-checkpoint-123456 created 3 h ago; subscription eventarc-us-central1-orbax2reg-on-checkpoint-123456-sub-789: " +
        "ack deadline 600 s, at least the function's timeout of 60 s; no dead-letter topic (Eventarc discards an event 24 h after it was sent)",
    );
  });

  test("a subscription not named eventarc-REGION-TRIGGER_ID-sub-, the prefix the backlog alert and the dashboard select by, fails the stage naming both", async () => {
    const renamed = "projects/p/subscriptions/eventarc-us-central1-renamed-sub-789";
    const r = await run(delivery({ subscription: renamed }));
    expect(r.ok).toBe(false);
    expect(r.detail).toContain(
      "subscription eventarc-us-central1-renamed-sub-789 does not start with eventarc-us-central1-orbax2reg-on-checkpoint-123456-sub-, the prefix the backlog alert",
    );
    expect(r.detail).toContain(`gcloud pubsub subscriptions describe ${renamed}`);
  });

  test("the prefix is the trigger's region and id, as alerts.tf derives it from the trigger's name", () => {
    expect(triggerSubscriptionPrefix(TRIGGER)).toBe("eventarc-us-central1-orbax2reg-on-checkpoint-123456-sub-");
    expect(triggerSubscriptionPrefix("not/a/trigger")).toBeUndefined();
  });

  test("a trigger created 30 s ago is waited for until it is two minutes old, said before the wait", async () => {
    const r = await run(delivery({ createTime: new Date(NOW - 30_000).toISOString() }));
    expect(r.ok).toBe(true);
    expect(r.slept).toEqual([90_000]);
    expect(r.notes).toHaveLength(1);
    expect(r.notes[0]).toMatch(/created 30 s ago; new Eventarc triggers can take up to two minutes to become operational: waiting 90 s/);
    expect(r.detail).toMatch(/^trigger orbax2reg-on-checkpoint-123456 created 30 s before the check: waited 90 s/);
  });

  test("the wait is bounded by two minutes, whatever the clocks say", async () => {
    const r = await run(delivery({ createTime: new Date(NOW + 3_600_000).toISOString() }));
    expect(r.slept).toEqual([TRIGGER_WARM_UP_MS]);
  });

  test("an ack deadline shorter than the function's timeout fails the stage with the command that raises it", async () => {
    const r = await run(delivery({ ackDeadlineSeconds: 10 }));
    expect(r.ok).toBe(false);
    expect(r.detail).toMatch(/ack deadline 10 s is shorter than the function's timeout of 60 s/);
    expect(r.detail).toContain(`gcloud pubsub subscriptions update ${SUBSCRIPTION} --ack-deadline=60`);
  });

  test("an unset ack deadline is Pub/Sub's default of 10 s", async () => {
    const r = await run(delivery({ ackDeadlineSeconds: undefined }));
    expect(r.detail).toMatch(/ack deadline 10 s is shorter/);
  });

  test("a dead-letter topic set on the subscription is reported with its attempts", async () => {
    const r = await run(delivery({ deadLetterTopic: "projects/p/topics/dead", maxDeliveryAttempts: 20 }));
    expect(r.detail).toMatch(/dead-letter topic projects\/p\/topics\/dead after 20 attempts$/);
  });

  test("a trigger that names no subscription yet fails, saying to run the check again", async () => {
    const r = await run(delivery({ subscription: undefined }));
    expect(r).toMatchObject({ ok: false, detail: expect.stringMatching(/names no Pub\/Sub subscription yet/) });
  });
});

describe("reading the trigger and its subscription (REST, a loopback stand-in answering as Google's APIs)", () => {
  let standIn: TriggerStandIn;
  beforeAll(async () => {
    standIn = await startTriggerStandIn({
      trigger: TRIGGER,
      subscription: SUBSCRIPTION,
      createTime: "2026-12-04T21:00:00.123456Z",
      ackDeadlineSeconds: 600,
      deadLetterPolicy: { deadLetterTopic: "projects/p/topics/dead", maxDeliveryAttempts: 5 },
    });
  });
  afterAll(() => standIn.close());

  test("the trigger's createTime and subscription, then the subscription's ack deadline and dead-letter policy", async () => {
    const d = await readTriggerDelivery(new PassThroughClient() as never, TRIGGER, { eventarc: standIn.url, pubsub: standIn.url });
    expect(d).toEqual({
      trigger: TRIGGER,
      createTime: "2026-12-04T21:00:00.123456Z",
      subscription: SUBSCRIPTION,
      ackDeadlineSeconds: 600,
      deadLetterTopic: "projects/p/topics/dead",
      maxDeliveryAttempts: 5,
    });
    expect(standIn.requests).toEqual([`/v1/${TRIGGER}`, `/v1/${SUBSCRIPTION}`]);
  });

  test("a trigger the API does not know fails with the URL and the status", async () => {
    await expect(
      readTriggerDelivery(new PassThroughClient() as never, "projects/p/locations/l/triggers/gone", {
        eventarc: standIn.url,
        pubsub: standIn.url,
      }),
    ).rejects.toMatchObject({ kind: "CLOUD_API", status: 404, message: expect.stringMatching(/triggers\/gone: HTTP 404: not found/) });
  });
});
