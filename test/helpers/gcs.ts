import { randomBytes } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { Storage } from "@google-cloud/storage";
import { inject } from "vitest";

/** A client for the fake-gcs-server the global setup started (the product picks it up the same way). */
export function emulatorStorage(): Storage {
  return new Storage({ apiEndpoint: inject("gcsEndpoint"), projectId: "test-project" });
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
