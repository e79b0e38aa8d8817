import { fileURLToPath } from "node:url";
import { UsageError } from "../errors.js";
import { LocalStore } from "./local.js";
import type { Store } from "./store.js";

/**
 * A store for a location: `gs://bucket/prefix`, `file:///abs/path`, or a plain local path. The GCS client
 * is loaded only when a gs:// location is used (it adds a quarter second to every start otherwise).
 */
export async function openStore(location: string): Promise<Store> {
  if (location.startsWith("gs://")) {
    const rest = location.slice("gs://".length);
    const slash = rest.indexOf("/");
    const bucket = slash < 0 ? rest : rest.slice(0, slash);
    const prefix = slash < 0 ? "" : rest.slice(slash + 1).replace(/\/+$/, "");
    if (bucket === "") throw new UsageError(`no bucket in ${JSON.stringify(location)}`);
    const { GcsStore } = await import("./gcs.js");
    return new GcsStore(bucket, prefix, location.replace(/\/+$/, ""));
  }
  if (location.startsWith("file://")) return new LocalStore(fileURLToPath(location), location);
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(location)) {
    throw new UsageError(`unsupported URL scheme in ${JSON.stringify(location)} (use a local path, file:// or gs://)`);
  }
  return new LocalStore(location);
}
