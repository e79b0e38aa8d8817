import { randomBytes } from "node:crypto";
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { IdempotencyStrategy, Storage, type StorageOptions } from "@google-cloud/storage";
import { inject } from "vitest";

/**
 * The tests' own storage clients (setting up buckets and objects, reading results): every transient failure is
 * retried, writes included, since what they write is the same on every attempt (an emulator under load resets a
 * kept-alive connection now and then: gunicorn's gthread worker under the storage-testbench does,
 * benoitc/gunicorn#3013; the client retries by default only what it can prove idempotent), and every request has a
 * deadline, so that a wedged emulator fails a test at once instead of hanging it (the client sets none).
 */
export const SETUP_CLIENT = {
  retryOptions: { autoRetry: true, maxRetries: 5, idempotencyStrategy: IdempotencyStrategy.RetryAlways },
  timeout: 60_000,
} satisfies StorageOptions;

/** A client for the fake-gcs-server the global setup started (the product picks it up the same way). */
export function emulatorStorage(): Storage {
  return new Storage({ apiEndpoint: inject("gcsEndpoint"), projectId: "test-project", ...SETUP_CLIENT });
}

/** A new, empty bucket with a unique name. */
export async function newBucket(prefix = "b"): Promise<string> {
  const name = `${prefix}-${randomBytes(6).toString("hex")}`;
  await emulatorStorage().createBucket(name);
  return name;
}

/** Uploads every file under `localDir` to gs://bucket/prefix/..., optionally holding some keys back. */
export async function uploadDir(
  localDir: string,
  bucket: string,
  prefix: string,
  skip: (key: string) => boolean = () => false,
  storage: Storage = emulatorStorage(),
): Promise<void> {
  const b = storage.bucket(bucket);
  const files = readdirSync(localDir, { recursive: true, withFileTypes: true })
    .filter((e) => !e.isDirectory())
    .map((e) => join(e.parentPath, e.name));
  await Promise.all(
    files
      .map((f) => relative(localDir, f).split("\\").join("/"))
      .filter((k) => !skip(k))
      .map((k) => b.file(prefix === "" ? k : `${prefix}/${k}`).save(readFileSync(join(localDir, k)), { resumable: false })),
  );
}

/** Downloads the objects under gs://bucket/prefix/ (a flat folder, as an export's) into `dir`; returns `dir`. */
export async function downloadDir(bucket: string, prefix: string, dir: string, storage: Storage = emulatorStorage()): Promise<string> {
  mkdirSync(dir, { recursive: true });
  const [found] = await storage.bucket(bucket).getFiles({ prefix: `${prefix}/` });
  for (const f of found) writeFileSync(join(dir, f.name.slice(prefix.length + 1)), (await f.download())[0]);
  return dir;
}
