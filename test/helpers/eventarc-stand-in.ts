import { createServer } from "node:http";

/**
 * Eventarc and Pub/Sub have no emulator for what `cloud check`'s delivery stage reads (src/cloud/api/trigger-delivery.ts):
 * a loopback stand-in answering `GET /v1/<trigger>` and `GET /v1/<subscription>` with the documented shapes
 * (https://cloud.google.com/eventarc/docs/reference/rest/v1/projects.locations.triggers: createTime,
 * transport.pubsub.subscription; https://cloud.google.com/pubsub/docs/reference/rest/v1/projects.subscriptions:
 * ackDeadlineSeconds, deadLetterPolicy), and 404 with an error body for anything else.
 */
export interface TriggerStandIn {
  readonly url: string;
  readonly requests: string[];
  close(): Promise<void>;
}

export async function startTriggerStandIn(o: {
  trigger: string;
  subscription: string;
  createTime: string;
  ackDeadlineSeconds: number;
  deadLetterPolicy?: { deadLetterTopic: string; maxDeliveryAttempts: number };
}): Promise<TriggerStandIn> {
  const requests: string[] = [];
  const server = createServer((req, res) => {
    requests.push(req.url ?? "");
    const body =
      req.method === "GET" && req.url === `/v1/${o.trigger}`
        ? {
            name: o.trigger,
            createTime: o.createTime,
            transport: { pubsub: { subscription: o.subscription, topic: `${o.trigger}-topic` } },
          }
        : req.method === "GET" && req.url === `/v1/${o.subscription}`
          ? {
              name: o.subscription,
              ackDeadlineSeconds: o.ackDeadlineSeconds,
              ...(o.deadLetterPolicy ? { deadLetterPolicy: o.deadLetterPolicy } : {}),
            }
          : undefined;
    res.writeHead(body ? 200 : 404, { "content-type": "application/json" });
    res.end(JSON.stringify(body ?? { error: { code: 404, message: "not found" } }));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : 0;
  return { url: `http://127.0.0.1:${port}`, requests, close: () => new Promise<void>((r) => server.close(() => r())) };
}
