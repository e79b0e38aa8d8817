import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { afterAll, afterEach, beforeAll, describe, expect, inject, test } from "vitest";
import { runJob } from "../../jobs/main.js";
import { jsonLogger } from "../../src/cloud/api/log.js";
import { type ProgressRecord, progressKey } from "../../src/convert/work-dir.js";
import { type FaultProxy, isDownload, isListing, startFaultProxy } from "../faults/proxy.js";
import { fixtureCase, removeScratch, scratch } from "../helpers/convert.js";
import { emulatorStorage, newBucket, uploadDir } from "../helpers/gcs.js";
import { freePort } from "../helpers/servers.js";

// The job as Cloud Run runs it: `node dist/jobs/main.js PHASE` in a process of its own (built by the global
// setup), against fake-gcs-server behind the fault proxy, which can hold a conversion mid-way.

const tiny = fixtureCase("tiny");

interface Job {
  readonly child: ChildProcess;
  readonly lines: Record<string, unknown>[];
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

function startJob(phase: string, env: Record<string, string>): Job {
  const child = spawn(process.execPath, ["dist/jobs/main.js", phase], { env: { ...process.env, ...env } });
  const lines: Record<string, unknown>[] = [];
  let pending = "";
  child.stdout?.on("data", (d) => {
    pending += d;
    const parts = pending.split("\n");
    pending = parts.pop() ?? "";
    for (const l of parts) if (l.startsWith("{")) lines.push(JSON.parse(l));
  });
  child.stderr?.resume();
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on("close", (code, signal) => resolve({ code, signal })),
  );
  return { child, lines, exited };
}

/** Polls until `ready` holds (the process under test decides how long that takes, not a timer). */
async function until(ready: () => boolean): Promise<void> {
  while (!ready()) await new Promise((r) => setTimeout(r, 20));
}

let proxy: FaultProxy;
let src: string;
let dst: string;
const running: Job[] = [];

beforeAll(async () => {
  src = await newBucket("src");
  dst = await newBucket("dst");
  await uploadDir(tiny.location, src, `run/${tiny.stepDir}`);
});
afterEach(async () => {
  for (const j of running.splice(0)) j.child.kill("SIGKILL");
  await proxy?.close();
});
afterAll(async () => {
  await proxy?.close();
  removeScratch();
});

const quiet = jsonLogger({}, () => {});
const baseEnv = (destination: string) => ({
  ORBAX2REG_SOURCE: `gs://${src}/run/${tiny.stepDir}`,
  ORBAX2REG_DESTINATION: destination,
  ORBAX2REG_STEP: "100",
  // A held request is never given up on while the test runs: whatever ends the job, it is not a timeout.
  ORBAX2REG_GCS_STALL_MS: "600000",
});
const fromSource = (method: string, url: string) => isDownload(method, url) && url.includes(`/b/${src}/o/`);

/**
 * A job process of `phase` against `destination`, through a proxy that holds every request `held` matches
 * until it closes; resolves once the job has sent one: a job caught mid-phase (its SIGTERM handler is in
 * place before its first request).
 */
async function heldJob(
  phase: string,
  destination: string,
  held: (method: string, url: string) => boolean,
  env: Record<string, string> = {},
) {
  proxy = await startFaultProxy({ upstream: inject("gcsEndpoint"), rules: [{ match: held, fault: "stall-headers" }] });
  const job = startJob(phase, { ...baseEnv(destination), ORBAX2REG_GCS_ENDPOINT: proxy.url, ...env });
  running.push(job);
  await until(() => proxy.log.some((r) => held(r.method, r.url)));
  return job;
}

/** A step planned into `destination`, and a convert-group task of it whose reads of the source hang. */
async function heldConversion(destination: string, env: Record<string, string> = {}): Promise<Job> {
  expect(await runJob("plan", baseEnv(destination), quiet)).toBe(0);
  return heldJob("convert-group", destination, fromSource, { ORBAX2REG_GROUP: "0", ...env });
}

const object = async (name: string): Promise<Buffer | undefined> => {
  const file = emulatorStorage().bucket(dst).file(name);
  return (await file.exists())[0] ? (await file.download())[0] : undefined;
};
const record = async (root: string, key: string) => JSON.parse(String(await object(`${root}/${tiny.stepDir}/${key}`))) as ProgressRecord;

const threads = (pid: number) => readdirSync(`/proc/${pid}/task`).length;

describe.skipIf(!existsSync("/proc/self/task"))("the job process", () => {
  test("runs with the CLI's 16 libuv threads, 12 more than a job told to use libuv's default 4", async () => {
    // A local destination: its plan is read through the thread pool, so the pool exists by the time the source hangs.
    const sixteen = threads((await heldConversion(scratch("threads")).then((j) => j.child.pid)) as number);
    await proxy.close();
    const four = threads((await heldConversion(scratch("threads"), { UV_THREADPOOL_SIZE: "4" }).then((j) => j.child.pid)) as number);
    expect(sixteen - four).toBe(12);
  });

  test("stopped by SIGTERM mid-conversion: one log line, its record marked stopped, exit 143 without waiting for the held request", async () => {
    const job = await heldConversion(`gs://${dst}/sigterm-group`);
    job.child.kill("SIGTERM");
    expect(await job.exited).toEqual({ code: 143, signal: null });
    expect(job.lines.filter((l) => l.severity !== "INFO")).toEqual([
      expect.objectContaining({ severity: "WARNING", message: expect.stringMatching(/^stopping \(SIGTERM/), phase: "convert-group" }),
    ]);
    expect(await record("sigterm-group", progressKey("convert-group", 0, 0))).toMatchObject({
      state: "stopped",
      error: expect.stringMatching(/SIGTERM/),
    });
    expect(await object(`sigterm-group/${tiny.stepDir}/index`)).toBeUndefined();
  });

  test("stopped by SIGTERM while finalizing: no index; a later finalize commits the step", async () => {
    const destination = `gs://${dst}/sigterm-finalize`;
    expect(await runJob("plan", baseEnv(destination), quiet)).toBe(0);
    expect(await runJob("convert-group", { ...baseEnv(destination), ORBAX2REG_GROUP: "0" }, quiet)).toBe(0);
    // Finalize lists the step to check it is complete before committing: that listing is held.
    const job = await heldJob("finalize", destination, (method, url) => isListing(method, url) && url.includes("sigterm-finalize"));
    job.child.kill("SIGTERM");
    expect(await job.exited).toEqual({ code: 143, signal: null });
    expect(await record("sigterm-finalize", progressKey("finalize", null, 0))).toMatchObject({ state: "stopped" });
    expect(await object(`sigterm-finalize/${tiny.stepDir}/index`)).toBeUndefined();

    expect(await runJob("finalize", baseEnv(destination), quiet)).toBe(0);
    expect(await object(`sigterm-finalize/${tiny.stepDir}/index`)).toBeDefined();
  });

  test("with storage unreachable, the first failed attempt is a WARNING at once; the report and record writes give up too", async () => {
    // Nothing listens on the port: every request is refused, and retried until the (shortened) deadline.
    const unreachable = `https://127.0.0.1:${await freePort()}`;
    const job = startJob("plan", {
      ...baseEnv("gs://nowhere/regular"),
      ORBAX2REG_GCS_ENDPOINT: unreachable,
      ORBAX2REG_GCS_RETRY_DEADLINE_MS: "2000",
      ORBAX2REG_ATTEMPT: "u1",
    });
    running.push(job);
    expect(await job.exited).toEqual({ code: 1, signal: null });
    expect(job.lines[0]).toMatchObject({
      severity: "WARNING",
      message: expect.stringMatching(/^storage request failed; retrying: connection failed/),
      phase: "plan",
      kind: "refused",
      retry: 1,
      retryForSeconds: 2,
    });
    // Many retries, one line for them (the next would come a minute later).
    const error = job.lines.find((l) => l.severity === "ERROR") as { message: string; storageRetries: { retries: number } };
    expect(error.message).toMatch(/failed after \d+ attempts/);
    expect(error.storageRetries.retries).toBeGreaterThan(1);
    expect(job.lines.filter((l) => String(l.message).includes("retrying"))).toHaveLength(1);
    const gaveUp = job.lines.filter((l) => l.severity === "WARNING").map((l) => l.message);
    expect(gaveUp).toContain("could not write the failure report");
    expect(gaveUp).toContain("could not write the progress record");
  });
});
