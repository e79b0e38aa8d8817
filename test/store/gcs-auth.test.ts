// Which endpoints get a bearer token: Google's, and any other endpoint of Google's (Private Service Connect, a
// regional one); never an emulator, unless ORBAX2REG_GCS_AUTH says otherwise.
import { describe, expect, test } from "vitest";
import { ConfigError } from "../../src/errors.js";
import { sendsCredentials } from "../../src/store/gcs/auth.js";

describe("credentials for an endpoint", () => {
  test.each([
    ["https://storage.googleapis.com", true],
    ["https://storage-psc.p.googleapis.com", true],
    ["https://storage.europe-west4.rep.googleapis.com", true],
    ["http://127.0.0.1:4443", false],
    ["https://127.0.0.1:4443", false],
    ["https://localhost:4443", false],
    ["https://[::1]:4443", false],
    ["http://gcs-emulator.internal:4443", false],
  ])("%s: %s", (url, sends) => {
    expect(sendsCredentials(url, false, undefined)).toBe(sends);
  });

  test("STORAGE_EMULATOR_HOST names an emulator, wherever it is", () => {
    expect(sendsCredentials("https://emulator.example.com", true, undefined)).toBe(false);
  });

  test("ORBAX2REG_GCS_AUTH overrides the guess either way", () => {
    expect(sendsCredentials("https://127.0.0.1:4443", false, "adc")).toBe(true);
    expect(sendsCredentials("https://storage.googleapis.com", false, "none")).toBe(false);
  });

  test("ORBAX2REG_GCS_AUTH with another value is refused, naming the variable", () => {
    expect(() => sendsCredentials("https://storage.googleapis.com", false, "yes")).toThrow(ConfigError);
    expect(() => sendsCredentials("https://storage.googleapis.com", false, "yes")).toThrow(/ORBAX2REG_GCS_AUTH="yes"/);
  });
});
