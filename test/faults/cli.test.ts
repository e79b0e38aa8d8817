// The real executable and the Cloud Run job entry point, gs:// to gs://, through the fault-injecting proxy:
// seeded faults are survived (and the result verifies); faults that never stop end the run with one line
// naming the object and the cause and exit 1, never a hang, a silent exit 13 or a missing failure report.
import { spawn } from "node:child_process";
import { afterAll, beforeAll, describe, expect, inject, test } from "vitest";
import { type FailureReport, failuresPrefix } from "../../src/convert/work-dir.js";
import { type CliResult, runBinAsync } from "../helpers/cli.js";
import { fixtureCase } from "../helpers/convert.js";
import { emulatorStorage, newBucket, uploadDir } from "../helpers/gcs.js";
import { type FaultProxy, isDownload, startFaultProxy } from "./proxy.js";

const tiny = fixtureCase("tiny");
const STEP = "ckpt/step_00000100";
/** The mix the soak runs, at its rates: what a busy GCS and a flaky network look like. */
export const SOAK_RATES = { "503": 0.05, "429": 0.02, reset: 0.01, "reset-mid-body": 0.01, truncate: 0.01, stall: 0.005, delay: 0.02 };
/** Short timeouts, so that stalls cost a test seconds, not minutes. */
const FAST_ENV = { ORBAX2REG_GCS_STALL_MS: "1000", ORBAX2REG_GCS_RETRY_DEADLINE_MS: "20000" };

let proxy: FaultProxy;
let src: string;
let dst: string;

beforeAll(async () => {
  proxy = await startFaultProxy({ upstream: inject("gcsEndpoint"), seed: 1 });
  src = await newBucket("src");
  dst = await newBucket("dst");
  await uploadDir(tiny.location, src, STEP);
}, 60_000);
afterAll(() => proxy.close());

const viaProxy = (args: string[], env: Record<string, string> = {}) =>
  runBinAsync(args, { ORBAX2REG_GCS_ENDPOINT: proxy.url, ...FAST_ENV, ...env });

const lastLine = (r: CliResult) => r.stderr.trimEnd().split("\n").at(-1) ?? "";

describe("convert through seeded faults", () => {
  for (const seed of [11, 12, 13]) {
    test(`seed ${seed}: convert gs:// -> gs:// succeeds, says how many retries it needed, and verify passes`, async () => {
      proxy = await restart(seed, SOAK_RATES);
      const out = `gs://${dst}/seed-${seed}`;
      const convert = await viaProxy(["convert", `gs://${src}/${STEP}`, out, "--json"]);
      expect(convert.stderr).not.toMatch(/error/);
      expect(convert.code).toBe(0);
      expect(JSON.parse(convert.stdout)).toMatchObject({ step: 100, committed: true, storageRetries: expect.any(Number) });
      const injected = Object.entries(proxy.stats.faults).filter(([k]) => k !== "delay");
      if (injected.length > 0) expect(convert.stderr).toMatch(/orbax2reg: \d+ storage requests? (was|were) retried \(/);
      const verify = await viaProxy(["verify", `gs://${src}/${STEP}`, `${out}/step_00000100`]);
      expect(verify.stdout).toMatch(/ 0 failed/);
      expect(verify.code).toBe(0);
    }, 120_000);
  }
});

describe("faults that never stop", () => {
  const cases: [string, Record<string, number>, RegExp][] = [
    ["503", { "503": 1 }, /HTTP 503/],
    ["reset", { reset: 1 }, /connection failed/],
    ["truncate", { truncate: 1 }, /connection failed|ended after/],
    ["stall", { stall: 1 }, /no progress for 0\.3 s/],
  ];
  for (const [name, rates, cause] of cases) {
    test(`${name} on every request: convert exits 1 with one last line naming the object and the cause`, async () => {
      proxy = await restart(1, rates);
      const started = Date.now();
      const r = await viaProxy(["convert", `gs://${src}/${STEP}`, `gs://${dst}/never-${name}`], {
        ORBAX2REG_GCS_STALL_MS: "300",
        ORBAX2REG_GCS_RETRY_DEADLINE_MS: "1500",
      });
      expect(r.code).toBe(1);
      expect(lastLine(r)).toMatch(new RegExp(`^orbax2reg: .*gs://${src}/${STEP}[^:]*: .* failed after \\d+ attempts? in \\d+\\.\\d s: `));
      expect(lastLine(r)).toMatch(cause);
      expect(r.stderr).not.toMatch(/\n\s+at /); // no stack trace
      expect(lastLine(r)).not.toMatch(/unexpected error/);
      expect(Date.now() - started).toBeLessThan(30_000);
    }, 60_000);
  }

  test("the job whose source reads keep failing exits 1, logs the object and the cause, and leaves its failure report", async () => {
    // Downloads fail for good; listings, stats and uploads (the plan, the report) get through.
    proxy = await restart(1, {}, [{ fault: "503", match: isDownload }]);
    const env = {
      ORBAX2REG_GCS_ENDPOINT: proxy.url,
      ...FAST_ENV,
      ORBAX2REG_GCS_RETRY_DEADLINE_MS: "1000",
      ORBAX2REG_SOURCE: `gs://${src}/${STEP}`,
      ORBAX2REG_DESTINATION: `gs://${dst}/job`,
      ORBAX2REG_STEP: "100",
      ORBAX2REG_ATTEMPT: "job-a1",
    };
    const r = await runJob("plan", env);
    expect(r.code).toBe(1);
    const error = r.lines.find((l) => l.severity === "ERROR");
    expect(error?.message).toMatch(new RegExp(`gs://${src}/${STEP}/.*: .*failed after \\d+ attempts? in .*HTTP 503`));
    expect(error).toMatchObject({ permanent: false, errorType: "StorageIoError" });
    const [reports] = await emulatorStorage()
      .bucket(dst)
      .getFiles({ prefix: `job/step_00000100/${failuresPrefix("job-a1")}` });
    expect(reports).toHaveLength(1);
    const [body] = await (reports[0] as (typeof reports)[number]).download();
    expect(JSON.parse(body.toString())).toMatchObject({
      phase: "plan",
      permanent: false,
      errorType: "StorageIoError",
    } satisfies Partial<FailureReport>);
  }, 60_000);
});

async function restart(seed: number, rates: Record<string, number>, rules: Parameters<FaultProxy["configure"]>[0]["rules"] = []) {
  await proxy.close();
  return startFaultProxy({ upstream: inject("gcsEndpoint"), seed, rates, rules, delayMs: 50 });
}

function runJob(phase: string, env: Record<string, string>): Promise<{ code: number; lines: Record<string, unknown>[] }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ["dist/jobs/main.js", phase], { env: { ...process.env, ...env } });
    let stdout = "";
    child.stdout.on("data", (d) => {
      stdout += d;
    });
    child.stderr.resume();
    child.on("close", (code) =>
      resolve({
        code: code ?? -1,
        lines: stdout
          .split("\n")
          .filter((l) => l.startsWith("{"))
          .map((l) => JSON.parse(l) as Record<string, unknown>),
      }),
    );
  });
}
