import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, inject, test } from "vitest";
import { removeScratch, scratch } from "../helpers/convert.js";
import { newBucket } from "../helpers/gcs.js";
import { freePort, type Running } from "../helpers/servers.js";
import { printLogsOnFailure, startFunction } from "./emulators.js";

// What the trigger function, served by the real functions-framework, answers when handling an event fails.
// Eventarc redelivers an event whose function fails, with backoff, for up to 24 h
// (https://cloud.google.com/eventarc/docs/retry-events): only a failure a retry can help (classify() in
// src/errors.ts) may fail the invocation; any other is logged and acknowledged. The Workflows API here is a
// port nothing listens on: every delivery that gets as far as it fails, as a transient failure.

let work: string;
let fn: Running;
let log: string;
let bucket: string;

beforeAll(async () => {
  work = scratch("function-failures");
  log = join(work, "function.log");
  bucket = await newBucket("train");
  fn = await startFunction(
    {
      ORBAX2REG_WORKFLOW: "projects/test-project/locations/us-central1/workflows/orbax2reg-convert",
      ORBAX2REG_GCS_ENDPOINT: inject("gcsEndpoint"),
      ORBAX2REG_WORKFLOWS_ENDPOINT: `http://127.0.0.1:${await freePort()}`,
      GOOGLE_CLOUD_PROJECT: "test-project",
      METADATA_SERVER_DETECTION: "none",
    },
    log,
  );
}, 120_000);

// A failed test prints the end of what the function logged.
printLogsOnFailure(() => work, ["function.log"]);

afterAll(async () => {
  await fn?.stop();
  removeScratch();
});

/**
 * POSTs a google.cloud.storage.object.v1.finalized CloudEvent (binary mode), as Eventarc does; returns the status.
 * `time` is the event's ce-time: when the object was finalized, as old as the event is.
 */
async function deliver(id: string, name: string, time = new Date(), url = fn.url): Promise<number> {
  const response = await fetch(url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      "ce-specversion": "1.0",
      "ce-id": id,
      "ce-type": "google.cloud.storage.object.v1.finalized",
      "ce-source": `//storage.googleapis.com/projects/_/buckets/${bucket}`,
      "ce-subject": `objects/${name}`,
      "ce-time": time.toISOString(),
    },
    body: JSON.stringify({ bucket, name, generation: "1" }),
  });
  return response.status;
}

/** The function's lines about event `id` (or all, for null), once there are any (its stdout reaches the log file a little later). */
async function linesOf(id: string | null, file = log): Promise<Record<string, unknown>[]> {
  for (let i = 0; ; i++) {
    const lines = readFileSync(file, "utf8")
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .filter((l) => id === null || l.eventId === id);
    if (lines.length > 0 || i === 50) return lines;
    await new Promise((r) => setTimeout(r, 100));
  }
}
const errorsOf = async (id: string | null, file = log) => (await linesOf(id, file)).filter((l) => l.severity === "ERROR");

describe("a delivery that fails", () => {
  test("for a reason no retry can help is acknowledged, with one ERROR line saying so", async () => {
    // A ".." segment in the checkpoint's name: its destination is refused (a UsageError) before anything starts.
    expect(await deliver("dotdot-1", "runs/../exp/step_00000100/commit_success.txt")).toBe(204);
    expect(await errorsOf("dotdot-1")).toEqual([
      expect.objectContaining({ errorKind: "USAGE", retryable: false, message: expect.stringMatching(/"\.\." segment/) }),
    ]);
  });

  test("for a reason a retry can help fails the invocation, for Eventarc to redeliver, with one WARNING line (not dropped)", async () => {
    expect(await deliver("unreachable-1", "runs/exp/step_00000100/commit_success.txt")).toBe(500);
    expect(await linesOf("unreachable-1")).toEqual([
      expect.objectContaining({
        severity: "WARNING",
        retryable: true,
        outcome: "redelivered",
        message: expect.stringMatching(/redelivers/),
      }),
    ]);
  });

  test("for a reason a retry can help, 31 minutes after the event was sent, is an ERROR line: the event is stuck", async () => {
    const sent = new Date(Date.now() - 31 * 60_000);
    expect(await deliver("stuck-1", "runs/exp/step_00000200/commit_success.txt", sent)).toBe(500);
    expect(await errorsOf("stuck-1")).toEqual([
      expect.objectContaining({ retryable: true, outcome: "stuck", message: expect.stringMatching(/^still failing 31 min after/) }),
    ]);
  });

  test("of an object that is no commit marker never happens: it is dismissed without a line", async () => {
    expect(await deliver("chunk-1", "runs/exp/regular/step_00000100/gda/w/0.0")).toBe(204);
    expect((await linesOf(null)).filter((l) => l.eventId === "chunk-1")).toEqual([]);
  });
});

describe("a misconfigured function", () => {
  test("acknowledges every event, with one ERROR line per instance naming the variable", async () => {
    const badLog = join(work, "misconfigured.log");
    const bad = await startFunction(
      { ORBAX2REG_WORKFLOW: "orbax2reg-convert", ORBAX2REG_GCS_ENDPOINT: inject("gcsEndpoint"), METADATA_SERVER_DETECTION: "none" },
      badLog,
    );
    try {
      for (const id of ["bad-1", "bad-2"])
        expect(await deliver(id, "runs/exp/step_00000100/commit_success.txt", new Date(), bad.url)).toBe(204);
      expect(await errorsOf(null, badLog)).toEqual([
        expect.objectContaining({
          variable: "ORBAX2REG_WORKFLOW",
          message: expect.stringMatching(/^misconfigured, events are acknowledged/),
        }),
      ]);
    } finally {
      await bad.stop();
    }
  });
});
