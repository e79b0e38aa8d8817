import { describe, expect, test } from "vitest";
import { rfc3339 } from "../../../src/cloud/api/timestamp.js";

describe("rfc3339", () => {
  test("a protobuf Timestamp, its seconds a number, a string or a Long-like, is RFC 3339 to the millisecond", () => {
    expect(rfc3339({ seconds: 1_700_000_000, nanos: 123_456_789 })).toBe("2023-11-14T22:13:20.123Z");
    expect(rfc3339({ seconds: "1700000000" })).toBe("2023-11-14T22:13:20.000Z");
    expect(rfc3339({ seconds: { toString: () => "1700000000" } })).toBe("2023-11-14T22:13:20.000Z");
  });

  test("a string passes through; an unset time is null, never the epoch", () => {
    expect(rfc3339("2026-12-01T10:00:00Z")).toBe("2026-12-01T10:00:00Z");
    for (const unset of [undefined, null, "", {}, { seconds: null }, { seconds: "x" }]) expect(rfc3339(unset)).toBeNull();
  });
});
