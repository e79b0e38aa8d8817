// Vitest global setup: generates the real Orbax fixtures (once, cached) and starts fake-gcs-server and, when
// it is installed, Google's storage-testbench on loopback for the whole run (scripts/install.sh installs them).
// Both serve HTTPS, as Cloud Storage does, with the test CA's loopback certificate (test/helpers/tls.mjs), and
// every process started after this trusts that CA through NODE_EXTRA_CA_CERTS: vitest's pool is "forks", so the
// test workers, and every process they start, inherit it from process.env set here before they start.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import type { TestProject } from "vitest/node";
import {
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
  buildCli();
  generateFixtures();
  generateInterrupted();
  generateManyChunks();
  generateAxlearnOrbax();
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
  };
}

/** The CLI tests run the real `bin/orbax2reg.js`, which loads the compiled dist/. */
function buildCli(): void {
  const r = spawnSync("npx", ["tsc", "-p", "tsconfig.build.json"], { stdio: "inherit" });
  if (r.status !== 0) throw new Error("tsc -p tsconfig.build.json failed");
}

/** Runs test/fixtures-gen/generate.py with the real orbax library unless its output is up to date. */
function generateFixtures(): void {
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
    const r = spawnSync(PYTHON, [script, GENERATED], { stdio: "inherit", timeout: 900_000 });
    if (r.status !== 0) throw new Error(`${script} failed (exit ${r.status})`);
  }
  writeFileSync(stampFile, stamp);
}

/** Runs test/fixtures-gen/interrupted.py (a save killed before Orbax's finalize) into its own directory, once. */
function generateInterrupted(): void {
  generateOnce("test/fixtures-gen/interrupted.py", INTERRUPTED_ROOT);
}

/** Runs test/fixtures-gen/many_chunks.py (a step of 6,400 small chunks) into its own directory, once. */
function generateManyChunks(): void {
  generateOnce("test/fixtures-gen/many_chunks.py", MANY_CHUNKS_ROOT);
}

/**
 * Runs test/fixtures-gen/axlearn_orbax.py (a two-process save by AXLearn's own OrbaxCheckpointer, with tf.data
 * iterators) with AXLearn's venv, once; without that venv the tests that read it skip.
 */
function generateAxlearnOrbax(): void {
  if (!existsSync(AXLEARN_PYTHON)) return;
  const script = "test/fixtures-gen/axlearn_orbax.py";
  const stamp = createHash("sha256")
    .update(readFileSync(script))
    .update(readFileSync("test/python/axlearn-requirements.txt"))
    .digest("hex");
  const stampFile = `${AXLEARN_ORBAX_ROOT}/.stamp`;
  if (existsSync(stampFile) && readFileSync(stampFile, "utf8") === stamp) return;
  rmSync(AXLEARN_ORBAX_ROOT, { recursive: true, force: true });
  const r = spawnSync(AXLEARN_PYTHON, [script, AXLEARN_ORBAX_ROOT], { stdio: "inherit", timeout: 300_000 });
  if (r.status !== 0) throw new Error(`${script} failed (exit ${r.status})`);
  writeFileSync(stampFile, stamp);
}

/** Runs a generator that builds on generate.py into `out` unless its output is up to date (its own stamp). */
function generateOnce(script: string, out: string): void {
  const stamp = createHash("sha256").update(readFileSync(script)).update(readFileSync("test/fixtures-gen/generate.py")).digest("hex");
  const stampFile = `${out}/.stamp`;
  if (existsSync(stampFile) && readFileSync(stampFile, "utf8") === stamp) return;
  rmSync(out, { recursive: true, force: true });
  const r = spawnSync(PYTHON, [script, out], { stdio: "inherit", timeout: 300_000 });
  if (r.status !== 0) throw new Error(`${script} failed (exit ${r.status})`);
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
