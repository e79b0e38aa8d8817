import { describe, expect, test } from "vitest";
import { retryCanHelp } from "../../src/cloud/status.js";

describe("whether running a failed conversion again may help", () => {
  test("a failed job without a permanent cause: yes", () => {
    expect(retryCanHelp({ message: "group 1 failed", tags: ["OperationError"] })).toBe(true);
  });

  test("a job that found bad input (PermanentError): no", () => {
    expect(retryCanHelp({ message: "group 1: damaged chunk", tags: ["PermanentError"] })).toBe(false);
  });

  test("a bad workflow argument (ValueError): no", () => {
    expect(retryCanHelp({ message: "destination must be gs://", tags: ["ValueError"] })).toBe(false);
  });

  test("an API that refused the request (HTTP 400, 403, 404): no", () => {
    for (const code of [400, 403, 404]) expect(retryCanHelp({ tags: ["HttpError"], code })).toBe(false);
  });

  test("an API that was busy or failed (HTTP 408, 429, 5xx): yes", () => {
    for (const code of [408, 429, 500, 503]) expect(retryCanHelp({ tags: ["HttpError"], code })).toBe(true);
  });

  test("an error nobody could read: yes (nothing says it cannot help)", () => {
    expect(retryCanHelp(undefined)).toBe(true);
  });
});
