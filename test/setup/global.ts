// Vitest global setup: generates the real Orbax fixtures (once, cached) and starts fake-gcs-server on
// loopback for the whole run; both are installed by scripts/install.sh.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import type { TestProject } from "vitest/node";
import { GENERATED, GENERATOR_INPUTS, INTERRUPTED_ROOT, MANY_CHUNKS_ROOT, PYTHON, TOOLS } from "../helpers/paths.js";
import { freePort, need, type Running, serve } from "../helpers/servers.js";

declare module "vitest" {
  export interface ProvidedContext {
    gcsEndpoint: string;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  buildCli();
  generateFixtures();
  generateInterrupted();
  generateManyChunks();
  const gcs = await startFakeGcs();
  project.provide("gcsEndpoint", gcs.url);
  process.env.ORBAX2REG_GCS_ENDPOINT = gcs.url; // inherited by the test workers
  return gcs.stop;
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

/** fake-gcs-server in memory; ready when its JSON API answers. */
async function startFakeGcs(): Promise<Running> {
  const bin = `${TOOLS}/fake-gcs-server`;
  need(bin);
  const port = await freePort();
  const args = ["-scheme", "http", "-host", "127.0.0.1", "-port", String(port), "-backend", "memory", "-log-level", "error"];
  const answers = async (url: string) => {
    try {
      return (await fetch(`${url}/storage/v1/b`)).ok;
    } catch {
      return false; // not listening yet
    }
  };
  return serve("fake-gcs-server", bin, args, port, { ready: answers, timeoutMs: 30_000 });
}
