// Google's storage-testbench (the global setup starts it when scripts/install.sh installed it): a second GCS
// emulator, stricter about JSON API requests than fake-gcs-server, with resumable uploads and fault injection
// by instruction (test/faults/instructions.ts).
import { randomBytes } from "node:crypto";
import { Storage } from "@google-cloud/storage";
import { inject } from "vitest";
import { SETUP_CLIENT } from "./gcs.js";

/** The testbench's endpoint, or undefined when it is not installed. */
export const testbenchEndpoint = (): string | undefined => inject("testbenchEndpoint") || undefined;

/** Why the testbench tests skip (a test name), or undefined when they run. */
export const testbenchMissing = (): string | undefined =>
  testbenchEndpoint() === undefined ? `skipped: ${inject("testbenchMissing")}` : undefined;

/** A client for the testbench, optionally through another endpoint in front of it (a proxy). */
export function testbenchStorage(endpoint = testbenchEndpoint()): Storage {
  if (endpoint === undefined) throw new Error("storage-testbench is not running");
  return new Storage({ apiEndpoint: endpoint, projectId: "test-project", ...SETUP_CLIENT });
}

/** A new, empty bucket on the testbench with a unique name. */
export async function newTestbenchBucket(prefix = "tb"): Promise<string> {
  const name = `${prefix}-${randomBytes(6).toString("hex")}`;
  await testbenchStorage().createBucket(name);
  return name;
}
