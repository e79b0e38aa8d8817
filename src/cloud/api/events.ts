/**
 * The one event schema published on the events topic (see docs/events.md). Attributes carry `type` and
 * `step` so subscriptions can filter without parsing the body.
 */
export type ConversionEventType =
  | "conversion.requested"
  | "conversion.succeeded"
  | "conversion.failed"
  | "conversion.pruned"
  // A Hugging Face export of the step (workflows/convert.yaml's export_step): destination is the export's folder.
  | "export.succeeded"
  | "export.failed";

export interface ConversionEvent {
  readonly type: ConversionEventType;
  /** The Orbax step converted (gs:// URL); for conversion.pruned, the one the deleted step was converted from. */
  readonly source: string;
  /** The regular checkpoint's root (gs:// URL); the step lands in `<destination>/step_XXXXXXXX`. */
  readonly destination: string;
  /**
   * The step converted; for conversion.pruned, the step deleted. Null only in a conversion.failed the workflow
   * published before its plan job read the argument (workflows/convert.yaml; the TypeScript publishers always know it).
   */
  readonly step: number | null;
  /** The Workflows execution name, when one exists. */
  readonly execution: string | null;
  readonly arrays: number | null;
  /** Bytes of array data converted (succeeded); bytes deleted (pruned). */
  readonly bytes: number | null;
  /** Seconds from the start of the workflow to this event. */
  readonly duration: number | null;
  /** What failed (failed groups and their errors), for conversion.failed. */
  readonly error: string | null;
  /** RFC 3339 time the event was emitted. */
  readonly time: string;
}

export function eventAttributes(e: ConversionEvent): Record<string, string> {
  return e.step === null ? { type: e.type } : { type: e.type, step: String(e.step) };
}

/** Publishes events to Pub/Sub, attributes included: one client for the caller's lifetime, loaded on first use. */
export async function pubsubPublisher(): Promise<(topic: string, event: ConversionEvent) => Promise<void>> {
  const { PubSub } = await import("@google-cloud/pubsub");
  const pubsub = new PubSub();
  return async (topic, event) => {
    await pubsub.topic(topic).publishMessage({ json: event, attributes: eventAttributes(event) });
  };
}
