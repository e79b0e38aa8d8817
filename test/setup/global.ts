// Vitest global setup: generates the real Orbax fixtures (once, cached) and starts fake-gcs-server on
// loopback for the whole run; both are installed by scripts/install.sh.
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import type { TestProject } from "vitest/node";
import { GENERATED, GENERATOR_INPUTS, PYTHON, TOOLS } from "../helpers/paths.js";
import { freePort, need } from "../helpers/servers.js";

declare module "vitest" {
  export interface ProvidedContext {
    gcsEndpoint: string;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  buildCli();
  generateFixtures();
  const gcs = await startFakeGcs();
  project.provide("gcsEndpoint", gcs.endpoint);
  process.env.ORBAX2REG_GCS_ENDPOINT = gcs.endpoint; // inherited by the test workers
  return async () => {
    gcs.process.kill("SIGTERM");
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

async function startFakeGcs(): Promise<{ endpoint: string; process: ChildProcess }> {
  const bin = `${TOOLS}/fake-gcs-server`;
  need(bin);
  const port = await freePort();
  const child = spawn(bin, ["-scheme", "http", "-host", "127.0.0.1", "-port", String(port), "-backend", "memory", "-log-level", "error"], {
    stdio: ["ignore", "ignore", "inherit"],
  });
  const endpoint = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    try {
      const r = await fetch(`${endpoint}/storage/v1/b`);
      if (r.ok) return { endpoint, process: child };
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  child.kill();
  throw new Error("fake-gcs-server did not start within 30 s");
}
