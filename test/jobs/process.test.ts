import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { afterAll, afterEach, beforeAll, describe, expect, inject, test } from "vitest";
import { runJob } from "../../jobs/main.js";
import { jsonLogger } from "../../src/cloud/log.js";
import { type FaultProxy, isDownload, startFaultProxy } from "../faults/proxy.js";
import { fixtureCase, removeScratch, scratch } from "../helpers/convert.js";
import { newBucket, uploadDir } from "../helpers/gcs.js";

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

/**
 * A step planned into `destination`, and a convert-group task of it whose reads of the source hang until
 * the proxy closes: a job process caught mid-conversion.
 */
async function heldConversion(destination: string, env: Record<string, string> = {}): Promise<Job> {
  const base = { ORBAX2REG_SOURCE: `gs://${src}/run/${tiny.stepDir}`, ORBAX2REG_DESTINATION: destination, ORBAX2REG_STEP: "100" };
  expect(
    await runJob(
      "plan",
      base,
      jsonLogger({}, () => {}),
    ),
  ).toBe(0);
  const fromSource = (method: string, url: string) => isDownload(method, url) && url.includes(`/b/${src}/o/`);
  proxy = await startFaultProxy({ upstream: inject("gcsEndpoint"), rules: [{ match: fromSource, fault: "stall-headers" }] });
  const job = startJob("convert-group", { ...base, ORBAX2REG_GCS_ENDPOINT: proxy.url, ORBAX2REG_GROUP: "0", ...env });
  running.push(job);
  await until(() => proxy.log.some((r) => fromSource(r.method, r.url)));
  return job;
}

const threads = (pid: number) => readdirSync(`/proc/${pid}/task`).length;

describe.skipIf(!existsSync("/proc/self/task"))("the job process", () => {
  test("runs with the CLI's 16 libuv threads, 12 more than a job told to use libuv's default 4", async () => {
    // A local destination: its plan is read through the thread pool, so the pool exists by the time the source hangs.
    const sixteen = threads((await heldConversion(scratch("threads")).then((j) => j.child.pid)) as number);
    await proxy.close();
    const four = threads((await heldConversion(scratch("threads"), { UV_THREADPOOL_SIZE: "4" }).then((j) => j.child.pid)) as number);
    expect(sixteen - four).toBe(12);
  });
});
