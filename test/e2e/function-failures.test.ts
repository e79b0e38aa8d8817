import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, inject, test } from "vitest";
import { removeScratch, scratch } from "../helpers/convert.js";
import { newBucket } from "../helpers/gcs.js";
import { freePort, type Running } from "../helpers/servers.js";
import { startFunction } from "./emulators.js";

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

afterAll(async () => {
  await fn?.stop();
  removeScratch();
});

/** POSTs a google.cloud.storage.object.v1.finalized CloudEvent (binary mode), as Eventarc does; returns the status. */
async function deliver(id: string, name: string): Promise<number> {
  const response = await fetch(fn.url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      "ce-specversion": "1.0",
      "ce-id": id,
      "ce-type": "google.cloud.storage.object.v1.finalized",
      "ce-source": `//storage.googleapis.com/projects/_/buckets/${bucket}`,
      "ce-subject": `objects/${name}`,
      "ce-time": new Date().toISOString(),
    },
    body: JSON.stringify({ bucket, name, generation: "1" }),
  });
  return response.status;
}

/** The function's ERROR lines about event `id`, once there are any (its stdout reaches the log file a little later). */
async function errorsOf(id: string): Promise<Record<string, unknown>[]> {
  for (let i = 0; ; i++) {
    const lines = readFileSync(log, "utf8")
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .filter((l) => l.eventId === id && l.severity === "ERROR");
    if (lines.length > 0 || i === 50) return lines;
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe("a delivery that fails", () => {
  test("for a reason no retry can help is acknowledged, with one ERROR line saying so", async () => {
    // A ".." segment in the checkpoint's name: its destination is refused (a UsageError) before anything starts.
    expect(await deliver("dotdot-1", "runs/../exp/step_00000100/commit_success.txt")).toBe(204);
    expect(await errorsOf("dotdot-1")).toEqual([
      expect.objectContaining({ errorKind: "USAGE", retryable: false, message: expect.stringMatching(/"\.\." segment/) }),
    ]);
  });

  test("for a reason a retry can help fails the invocation, for Eventarc to redeliver, with one ERROR line", async () => {
    expect(await deliver("unreachable-1", "runs/exp/step_00000100/commit_success.txt")).toBe(500);
    expect(await errorsOf("unreachable-1")).toEqual([expect.objectContaining({ retryable: true })]);
  });
});
