// A checkpoint root for the tests of the cloud operations that read one (backfill): gs://b/runs/exp as local
// directories, its claims' conditional writes in memory.
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Executions } from "../../src/cloud/api/executions.js";
import { jsonLogger } from "../../src/cloud/api/log.js";
import type { FleetDeps } from "../../src/cloud/ops/status.js";
import type { StartDeps } from "../../src/cloud/trigger/start.js";
import { stepDirName } from "../../src/orbax/step.js";
import { openStore } from "../../src/store/open.js";
import type { Store, Versioned, VersionedObjects } from "../../src/store/store.js";
import { tempDir } from "./tmp.js";

export const ROOT = "gs://b/runs/exp";
export const WORKFLOW = "projects/p/locations/l/workflows/orbax2reg-convert";

/** Conditional writes in memory, as GCS generations behave. */
export function memoryVersions(): VersionedObjects {
  const objects = new Map<string, Versioned>();
  let generation = 0;
  return {
    get: async (key) => objects.get(key),
    async create(key, data) {
      if (objects.has(key)) return undefined;
      const version = String(++generation);
      objects.set(key, { data, version });
      return version;
    },
    async replace(key, data, version) {
      if (objects.get(key)?.version !== version) return undefined;
      const next = String(++generation);
      objects.set(key, { data, version: next });
      return next;
    },
    async delete(key, version) {
      if (objects.get(key)?.version !== version) return false;
      objects.delete(key);
      return true;
    },
  };
}

/**
 * ROOT in a new temporary directory (`label`) that stands for gs://b: `steps` committed (their commit_success.txt)
 * and an empty destination, runs/exp/regular. Returns the directory.
 */
export function localRoot(label: string, steps: Iterable<number>): string {
  const base = tempDir(label);
  for (const s of steps) {
    mkdirSync(join(base, "runs/exp", stepDirName(s)), { recursive: true });
    writeFileSync(join(base, "runs/exp", stepDirName(s), "commit_success.txt"), "");
  }
  mkdirSync(join(base, "runs/exp/regular"), { recursive: true });
  return base;
}

/**
 * What backfill reads the root and starts conversions through: `executions`, WORKFLOW, destinations at
 * gs://{bucket}/{root}/regular, gs://b opened in `base` (localRoot) with the claims in memory, no log.
 */
export function localRootDeps(base: string, executions: Executions): FleetDeps & StartDeps {
  const claims = memoryVersions();
  return {
    executions,
    workflow: WORKFLOW,
    destinationTemplate: "gs://{bucket}/{root}/regular",
    claimLeaseMs: 600_000,
    log: jsonLogger({}, () => {}),
    async openStore(location): Promise<Store> {
      const store = await openStore(location.replace(/^gs:\/\/b/, base));
      return new Proxy(store, { get: (target, key) => (key === "versioned" ? claims : Reflect.get(target, key, target)) });
    },
  };
}
