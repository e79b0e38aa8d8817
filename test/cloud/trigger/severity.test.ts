import { describe, expect, test } from "vitest";
import { failureLine, failureVerdict, STUCK_AFTER_MS } from "../../../src/cloud/trigger/severity.js";

// ERROR is what the trigger-side alert (terraform alerts.tf) fires on: an event that will not start a conversion
// unless someone acts. A failure Eventarc redelivers is a WARNING until it has gone on for STUCK_AFTER_MS.

const NOW = Date.parse("2026-12-02T12:00:00Z");
const ago = (ms: number) => new Date(NOW - ms).toISOString();

describe("a failed delivery's severity", () => {
  test("a failure no retry can help drops the event: ERROR", () => {
    expect(failureVerdict(false, ago(1_000), NOW)).toEqual({ severity: "ERROR", outcome: "dropped", ageMs: 1_000 });
  });

  test("a retryable failure of a young event is redelivered: WARNING", () => {
    expect(failureVerdict(true, ago(STUCK_AFTER_MS - 1), NOW)).toMatchObject({ severity: "WARNING", outcome: "redelivered" });
  });

  test("a retryable failure of an event older than STUCK_AFTER_MS (a claim that stays busy): ERROR", () => {
    const v = failureVerdict(true, ago(STUCK_AFTER_MS), NOW);
    expect(v).toEqual({ severity: "ERROR", outcome: "stuck", ageMs: STUCK_AFTER_MS });
    expect(failureLine(v, "claim busy")).toBe("still failing 30 min after the event was sent (Eventarc drops it 24 h after): claim busy");
  });

  test("an event without a readable time cannot be aged: a retryable failure stays a WARNING, and says why", () => {
    for (const time of [undefined, "yesterday"]) {
      const v = failureVerdict(true, time, NOW);
      expect(v).toEqual({ severity: "WARNING", outcome: "redelivered", ageMs: null });
      expect(failureLine(v, "x")).toContain("its age is unknown");
    }
  });

  test("STUCK_AFTER_MS leaves many redeliveries before Eventarc's 24 h and fits several 600 s backoffs", () => {
    expect(STUCK_AFTER_MS).toBeGreaterThanOrEqual(3 * 600_000);
    expect(STUCK_AFTER_MS).toBeLessThanOrEqual(60 * 60_000);
  });
});
