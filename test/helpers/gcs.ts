import { randomBytes } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { IdempotencyStrategy, Storage, type StorageOptions } from "@google-cloud/storage";
import { inject } from "vitest";

/**
 * The tests' own requests (setting up buckets and objects, reading results) retry every transient failure, writes
 * included: what they write is the same on every attempt, and an emulator under load resets a kept-alive
 * connection now and then (gunicorn's gthread worker under the storage-testbench does: benoitc/gunicorn#3013),
 * which the client retries by default only for requests it can prove idempotent.
 */
export const SETUP_RETRIES: StorageOptions["retryOptions"] = {
  autoRetry: true,
  maxRetries: 5,
  idempotencyStrategy: IdempotencyStrategy.RetryAlways,
};

/** A client for the fake-gcs-server the global setup started (the product picks it up the same way). */
export function emulatorStorage(): Storage {
  return new Storage({ apiEndpoint: inject("gcsEndpoint"), projectId: "test-project", retryOptions: SETUP_RETRIES });
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
