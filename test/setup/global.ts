// Vitest global setup: generates the real Orbax fixtures (once, cached) and starts fake-gcs-server and, when
// it is installed, Google's storage-testbench on loopback for the whole run (scripts/install.sh installs them).
// Both serve HTTPS, as Cloud Storage does, with the test CA's loopback certificate (test/helpers/tls.mjs), and
// every process started after this trusts that CA through NODE_EXTRA_CA_CERTS: vitest's pool is "forks", so the
// test workers, and every process they start, inherit it from process.env set here before they start.
// TMPDIR the same way: the run's own temporary folder (test/helpers/run-tmp.ts), set first, so that the
// generators, the servers and every test make their temporary files in it; removed last, after the servers stop
// (gunicorn makes its worker's heartbeat file in it), and by an "exit" handler when vitest exits without its
// teardown (Ctrl-C, a failed setup). ORBAX2REG_KEEP_TMP=1 keeps it. test/.generated stays where it is: cached.
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { lock } from "proper-lockfile";
import type { TestProject } from "vitest/node";
import {
  AXLEARN_FUJI_ROOT,
  AXLEARN_ORBAX_ROOT,
  AXLEARN_PYTHON,
  GENERATED,
  GENERATOR_INPUTS,
  INTERRUPTED_ROOT,
  MANY_CHUNKS_ROOT,
  PYTHON,
  TESTBENCH_VENV,
  TOOLS,
} from "../helpers/paths.js";
import { makeRunTmp } from "../helpers/run-tmp.js";
import { answers, freePort, need, type Running, serve } from "../helpers/servers.js";
import { testTls, trustTestCa } from "../helpers/tls.mjs";

declare module "vitest" {
  export interface ProvidedContext {
    gcsEndpoint: string;
    /** The storage-testbench's endpoint, or "" when it is not installed (then `testbenchMissing` says why). */
    testbenchEndpoint: string;
    testbenchMissing: string;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const runTmp = makeRunTmp(tmpdir());
  process.env.TMPDIR = runTmp.dir; // inherited by everything started from here on; os.tmpdir() reads it each call
  // First: vitest's own "exit" listener (Ctrl-C, SIGTERM) calls process.exit() again, which ends the process
  // there, before any listener registered after it.
  process.prependOnceListener("exit", runTmp.end);
  // Two runs at once (scripts/repeat-suites.sh, a developer's run beside CI's) would each find the fixtures
  // missing and generate them into the same folders, removing the other's half-written files: one generates,
  // the other waits for it and then finds them up to date.
  mkdirSync("test/.generated", { recursive: true });
  const release = await lock("test/.generated", {
    lockfilePath: "test/.generated/.generating.lock",
    // Refreshed while the generators run (they run as child processes, so this event loop goes on); a run
    // killed while holding it leaves a lock that is taken over a minute after its last refresh.
    stale: 60_000,
    // Half a second apart for 55 minutes: longer than the generators' own time limits add up to (2 x 900 s and
    // 4 x 300 s, below), so a holder still at work is waited for to its end.
    retries: { retries: 6_600, minTimeout: 500, maxTimeout: 500 },
  });
  try {
    await buildCli();
    await generateFixtures();
    await generateInterrupted();
    await generateManyChunks();
    await generateWithAxlearn("test/fixtures-gen/axlearn_orbax.py", AXLEARN_ORBAX_ROOT);
    await generateWithAxlearn("test/fixtures-gen/axlearn_fuji.py", AXLEARN_FUJI_ROOT);
  } finally {
    await release();
  }
  trustTestCa(); // before any worker or server starts
  const gcs = await startFakeGcs();
  project.provide("gcsEndpoint", gcs.url);
  process.env.ORBAX2REG_GCS_ENDPOINT = gcs.url; // inherited by the test workers
  const testbench = await startTestbench();
  project.provide("testbenchEndpoint", testbench.running?.url ?? "");
  project.provide("testbenchMissing", testbench.missing ?? "");
  return async () => {
    if (testbench.running) {
      process.stderr.write(`storage-testbench: peak RSS ${peakRssMiB(testbench.running.pid)} MiB\n`);
      await testbench.running.stop();
    }
    await gcs.stop();
    runTmp.end();
  };
}

/**
 * Runs a command with this process's output, killed after `timeoutMs`; resolves to its exit code (null when a
 * signal ended it). Not spawnSync: the generation lock is refreshed by this event loop while it waits.
 */
function run(cmd: string, args: string[], timeoutMs?: number): Promise<number | null> {
  return new Promise((done, fail) => {
    const child = spawn(cmd, args, { stdio: "inherit", timeout: timeoutMs });
    child.once("error", fail);
    child.once("exit", (code) => done(code));
  });
}

/** The CLI tests run the real `bin/orbax2reg.js`, which loads the compiled dist/. */
async function buildCli(): Promise<void> {
  if ((await run("npx", ["tsc", "-p", "tsconfig.build.json"])) !== 0) throw new Error("tsc -p tsconfig.build.json failed");
}

/** Runs test/fixtures-gen/generate.py with the real orbax library unless its output is up to date. */
async function generateFixtures(): Promise<void> {
  need(PYTHON);
  const hash = createHash("sha256");
  for (const f of GENERATOR_INPUTS) hash.update(readFileSync(f));
  const stamp = hash.digest("hex");
  const stampFile = `${GENERATED}/.stamp`;
  if (existsSync(stampFile) && readFileSync(stampFile, "utf8") === stamp) return;
  rmSync(GENERATED, { recursive: true, force: true });
  process.stderr.write("generating Orbax fixtures with the real orbax-checkpoint (once)...\n");
  for (const script of ["test/fixtures-gen/generate.py", "test/fixtures-gen/bigtree.py"]) {
    if (!existsSync(script)) continue;
    const status = await run(PYTHON, [script, GENERATED], 900_000);
    if (status !== 0) throw new Error(`${script} failed (exit ${status})`);
  }
  writeFileSync(stampFile, stamp);
}

/** Runs test/fixtures-gen/interrupted.py (a save killed before Orbax's finalize) into its own directory, once. */
async function generateInterrupted(): Promise<void> {
  await generateOnce("test/fixtures-gen/interrupted.py", INTERRUPTED_ROOT);
}

/** Runs test/fixtures-gen/many_chunks.py (a step of 6,400 small chunks) into its own directory, once. */
async function generateManyChunks(): Promise<void> {
  await generateOnce("test/fixtures-gen/many_chunks.py", MANY_CHUNKS_ROOT);
}

/**
 * Runs an AXLearn fixture generator with AXLearn's venv into `out`, once (its own stamp: the script and the venv's
 * requirements); without that venv the tests that read it skip. test/fixtures-gen/axlearn_orbax.py: a two-process
 * save by AXLearn's own OrbaxCheckpointer, with tf.data iterators; axlearn_fuji.py: small fuji-shaped LMs built
 * from AXLearn's own layers, saved by its OrbaxCheckpointer, with AXLearn's logits.
 */
async function generateWithAxlearn(script: string, out: string): Promise<void> {
  if (!existsSync(AXLEARN_PYTHON)) return;
  const stamp = createHash("sha256")
    .update(readFileSync(script))
    .update(readFileSync("test/python/axlearn-requirements.txt"))
    .digest("hex");
  const stampFile = `${out}/.stamp`;
  if (existsSync(stampFile) && readFileSync(stampFile, "utf8") === stamp) return;
  rmSync(out, { recursive: true, force: true });
  const status = await run(AXLEARN_PYTHON, [script, out], 300_000);
  if (status !== 0) throw new Error(`${script} failed (exit ${status})`);
  writeFileSync(stampFile, stamp);
}

/** Runs a generator that builds on generate.py into `out` unless its output is up to date (its own stamp). */
async function generateOnce(script: string, out: string): Promise<void> {
  const stamp = createHash("sha256").update(readFileSync(script)).update(readFileSync("test/fixtures-gen/generate.py")).digest("hex");
  const stampFile = `${out}/.stamp`;
  if (existsSync(stampFile) && readFileSync(stampFile, "utf8") === stamp) return;
  rmSync(out, { recursive: true, force: true });
  const status = await run(PYTHON, [script, out], 300_000);
  if (status !== 0) throw new Error(`${script} failed (exit ${status})`);
  writeFileSync(stampFile, stamp);
}

/**
 * fake-gcs-server in memory over HTTPS (its -scheme, -cert-location and -private-key-location flags,
 * internal/config/config.go of v1.56.1); ready when its JSON API answers.
 */
async function startFakeGcs(): Promise<Running> {
  const bin = `${TOOLS}/fake-gcs-server`;
  need(bin);
  const port = await freePort();
  const { certFile, keyFile } = testTls();
  const args = ["-scheme", "https", "-cert-location", certFile, "-private-key-location", keyFile];
  args.push("-host", "127.0.0.1", "-port", String(port), "-backend", "memory", "-log-level", "error");
  return serve("fake-gcs-server", bin, args, port, { scheme: "https", ready: answers("/storage/v1/b"), timeoutMs: 30_000 });
}

/**
 * Google's storage-testbench (github.com/googleapis/storage-testbench), as its README runs it (but over HTTPS): gunicorn, one
 * worker process (it holds every bucket and object in that process's memory, so there must be only one) with
 * threads for concurrent requests. Not installed: the tests that need it skip, and this says why once.
 */
async function startTestbench(): Promise<{ running?: Running; missing?: string }> {
  const gunicorn = `${TESTBENCH_VENV}/bin/gunicorn`;
  if (!existsSync(gunicorn)) {
    const missing = `storage-testbench is not installed (${gunicorn}): set ORBAX2REG_STORAGE_TESTBENCH and run scripts/install.sh`;
    process.stderr.write(`skipping the storage-testbench tests: ${missing}\n`);
    return { missing };
  }
  const port = await freePort();
  mkdirSync("test/.generated", { recursive: true });
  // Over HTTPS: gunicorn's --certfile and --keyfile (https://docs.gunicorn.org/en/stable/settings.html#ssl).
  const { certFile, keyFile } = testTls();
  const args = ["--bind", `127.0.0.1:${port}`, "--certfile", certFile, "--keyfile", keyFile];
  args.push("--worker-class", "gthread", "--workers", "1", "--threads", "16", "testbench:run()");
  const running = await serve("storage-testbench", gunicorn, args, port, {
    scheme: "https",
    ready: answers("/storage/v1/b?project=test-project"),
    timeoutMs: 60_000,
    logFile: "test/.generated/storage-testbench.log",
  });
  return { running };
}

/** The peak resident memory of a server: the largest VmHWM of the process and its children (gunicorn's worker). */
function peakRssMiB(pid: number | undefined): string {
  if (pid === undefined) return "?";
  const hwm = (p: number) => Number(/VmHWM:\s+(\d+) kB/.exec(readIf(`/proc/${p}/status`))?.[1] ?? 0);
  const children = readIf(`/proc/${pid}/task/${pid}/children`).trim().split(/\s+/).filter(Boolean).map(Number);
  return (Math.max(hwm(pid), ...children.map(hwm)) / 1024).toFixed(0);
}

function readIf(path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return "";
  }
}
