/**
 * How loudly a failed delivery is logged. The alert on the trigger side (terraform alerts.tf, "event_dropped") fires on
 * the function's ERROR lines, so ERROR means exactly "this event will not start a conversion unless someone acts":
 *
 * - a failure no retry can help: the event is acknowledged, so it is dropped;
 * - a failure a retry can help, while the event is young: WARNING, the invocation fails and Eventarc redelivers it
 *   with backoff (10 s doubling to 600 s: https://cloud.google.com/eventarc/docs/retry-events); a claim held for a
 *   moment by a concurrent delivery, a Workflows API hiccup;
 * - the same, once the event has been failing for STUCK_AFTER_MS: ERROR on every further attempt. Eventarc drops the
 *   event 24 h after it was published (the subscription's retention), so a claim that stays busy or an API that keeps
 *   refusing must be seen long before that, not never.
 */
export const STUCK_AFTER_MS = 30 * 60_000;

export type FailureVerdict =
  | { readonly severity: "ERROR"; readonly outcome: "dropped" | "stuck"; readonly ageMs: number | null }
  | { readonly severity: "WARNING"; readonly outcome: "redelivered"; readonly ageMs: number | null };

/**
 * The verdict on one failed delivery: `retryable` as classify() (src/errors.ts) says, `eventTime` the CloudEvent's
 * `time` attribute (when the object was finalized: Eventarc sets it on every Cloud Storage event). A missing or
 * unreadable time cannot be aged: such a delivery is only ever a WARNING, and the line says it cannot tell.
 */
export function failureVerdict(retryable: boolean, eventTime: string | undefined, now: number): FailureVerdict {
  const sent = eventTime === undefined ? Number.NaN : Date.parse(eventTime);
  const ageMs = Number.isNaN(sent) ? null : Math.max(0, now - sent);
  if (!retryable) return { severity: "ERROR", outcome: "dropped", ageMs };
  if (ageMs !== null && ageMs >= STUCK_AFTER_MS) return { severity: "ERROR", outcome: "stuck", ageMs };
  return { severity: "WARNING", outcome: "redelivered", ageMs };
}

/** The line for a failed delivery: what failed, and what becomes of the event. */
export function failureLine(verdict: FailureVerdict, line: string): string {
  switch (verdict.outcome) {
    case "dropped":
      return `event dropped (no retry can help): ${line}`;
    case "stuck":
      return `still failing ${Math.round((verdict.ageMs ?? 0) / 60_000)} min after the event was sent (Eventarc drops it 24 h after): ${line}`;
    case "redelivered":
      return `failed, Eventarc redelivers the event${verdict.ageMs === null ? " (its age is unknown: no event time)" : ""}: ${line}`;
  }
}
