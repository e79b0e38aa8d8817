import { describe, expect, test } from "vitest";
import {
  cloudRunTask,
  eventsTopic,
  flag,
  integer,
  OUTSIDE_CLOUD_RUN,
  optionalInteger,
  optionalString,
  requiredString,
} from "../../../src/cloud/api/env.js";
import { ConfigError, Orbax2RegError } from "../../../src/errors.js";

// The one reader of environment variables for the trigger function, the Cloud Run jobs and the CLI.

/** The ConfigError `read` throws (fails the test when it returns or throws anything else). */
const refusal = (read: () => unknown): ConfigError => {
  try {
    read();
  } catch (e) {
    if (e instanceof ConfigError) return e;
    throw e;
  }
  throw new Error("accepted");
};

describe("ConfigError", () => {
  test("names the variable and its value, and says why", () => {
    const e = refusal(() => integer({ N: "x" }, "N", { min: 1, max: 9 }));
    expect(e.message).toBe('environment variable N="x": must be an integer from 1 to 9');
    expect(e).toMatchObject({ variable: "N", value: "x", name: "ConfigError" });
  });

  test("says a missing variable is not set", () => {
    expect(refusal(() => requiredString({}, "ORBAX2REG_DESTINATION")).message).toBe(
      "environment variable ORBAX2REG_DESTINATION is not set: required",
    );
  });

  test("is an Orbax2RegError, so a job treats it as permanent and the CLI prints it as one line", () => {
    expect(refusal(() => requiredString({}, "X"))).toBeInstanceOf(Orbax2RegError);
  });
});

describe("strings", () => {
  test("a required string that is empty is refused like a missing one", () => {
    expect(refusal(() => requiredString({ X: "" }, "X")).why).toBe("required");
  });

  test("a required string must match its pattern when it has one", () => {
    expect(refusal(() => requiredString({ X: "b" }, "X", { re: /^a$/, what: "a" })).why).toBe("must be a");
  });

  test("an optional string that is absent or empty is its fallback", () => {
    expect(optionalString({}, "X", "d")).toBe("d");
    expect(optionalString({ X: "" }, "X", "d")).toBe("d");
    expect(optionalString({ X: "v" }, "X", "d")).toBe("v");
  });
});

describe("integers", () => {
  test("an integer in range is read", () => {
    expect(integer({ N: "7" }, "N", { min: 1, max: 9 })).toBe(7);
  });

  test("an absent or empty integer is its fallback, or refused without one", () => {
    expect(integer({ N: "" }, "N", { min: 1, max: 9, fallback: 3 })).toBe(3);
    expect(refusal(() => integer({}, "N", { min: 1, max: 9 })).why).toBe("required");
  });

  test.each(["0", "10", "-1", "1.5", "1e3", " 5", "0x5"])("%j is refused for a range of 1 to 9", (v) => {
    expect(refusal(() => integer({ N: v }, "N", { min: 1, max: 9 })).value).toBe(v);
  });

  test("a number too long for its range is refused, not rounded", () => {
    expect(() => integer({ N: "99999999999999999999" }, "N", { min: 0, max: Number.MAX_SAFE_INTEGER })).toThrow(ConfigError);
  });

  test("an optional integer that is absent or empty is undefined; present, it is checked", () => {
    expect(optionalInteger({}, "N", { min: 0, max: 9 })).toBeUndefined();
    expect(optionalInteger({ N: "" }, "N", { min: 0, max: 9 })).toBeUndefined();
    expect(optionalInteger({ N: "4" }, "N", { min: 0, max: 9 })).toBe(4);
    expect(() => optionalInteger({ N: "four" }, "N", { min: 0, max: 9 })).toThrow(ConfigError);
  });
});

describe("switches", () => {
  test.each(["1", "true", "TRUE", "yes", "Yes"])("%j is on", (v) => {
    expect(flag({ F: v }, "F")).toBe(true);
  });

  test.each([undefined, "", "0", "false", "False", "no", "NO"])("%j is off", (v) => {
    expect(flag({ F: v }, "F")).toBe(false);
  });

  test.each(["on", "y", "2", "ture", " true"])("%j is refused: a misspelt switch must not silently mean off", (v) => {
    expect(refusal(() => flag({ F: v }, "F")).variable).toBe("F");
  });
});

describe("ORBAX2REG_EVENTS_TOPIC", () => {
  test("absent or empty means no events", () => {
    expect(eventsTopic({})).toBeUndefined();
    expect(eventsTopic({ ORBAX2REG_EVENTS_TOPIC: "" })).toBeUndefined();
  });

  test("must be a full topic id", () => {
    expect(eventsTopic({ ORBAX2REG_EVENTS_TOPIC: "projects/p/topics/t" })).toBe("projects/p/topics/t");
    expect(refusal(() => eventsTopic({ ORBAX2REG_EVENTS_TOPIC: "t" })).why).toMatch(/full topic id/);
  });
});

describe("Cloud Run's task variables", () => {
  test("outside Cloud Run a process is the only task, on its first try", () => {
    expect(cloudRunTask({})).toEqual({ index: 0, count: 1, attempt: 0 });
    expect(OUTSIDE_CLOUD_RUN).toEqual({ index: 0, count: 1, attempt: 0 });
  });

  test("in a job task they give its index, the task count and the attempt", () => {
    expect(cloudRunTask({ CLOUD_RUN_TASK_INDEX: "3", CLOUD_RUN_TASK_COUNT: "4", CLOUD_RUN_TASK_ATTEMPT: "2" })).toEqual({
      index: 3,
      count: 4,
      attempt: 2,
    });
  });

  test("each one left out takes its default", () => {
    expect(cloudRunTask({ CLOUD_RUN_TASK_COUNT: "4" })).toEqual({ index: 0, count: 4, attempt: 0 });
  });

  test.each([
    ["CLOUD_RUN_TASK_INDEX", "x"],
    ["CLOUD_RUN_TASK_COUNT", "0"],
    ["CLOUD_RUN_TASK_ATTEMPT", "-1"],
  ])("a malformed %s=%j is a ConfigError naming it", (name, value) => {
    expect(refusal(() => cloudRunTask({ [name]: value })).variable).toBe(name);
  });

  test("read leniently, a malformed value is its default and the others still count", () => {
    expect(cloudRunTask({ CLOUD_RUN_TASK_INDEX: "x", CLOUD_RUN_TASK_COUNT: "0", CLOUD_RUN_TASK_ATTEMPT: "2" }, { lenient: true })).toEqual({
      index: 0,
      count: 1,
      attempt: 2,
    });
  });
});
