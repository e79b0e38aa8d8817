import { realpath } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { UsageError } from "../errors.js";
import type { GcsOptions } from "./gcs.js";
import { LocalStore } from "./local.js";
import type { Store } from "./store.js";

/** A location in its one canonical spelling. */
export type Location =
  | { readonly kind: "gcs"; readonly bucket: string; readonly prefix: string; readonly url: string }
  | { readonly kind: "local"; readonly path: string; readonly url: string };

/**
 * Parses a location the one way every part of the tool uses. `gs://bucket/prefix`: GCS object names are
 * the prefix joined to keys with single slashes, so empty segments (`//`) and leading or trailing slashes
 * are dropped (`gs://b//x/` is `gs://b/x`), and `.`/`..` segments are refused (GCS would keep them
 * literally while every path-minded reader collapses them). `file:///abs` and plain paths are local.
 */
export function parseLocation(location: string): Location {
  if (location.startsWith("gs://")) {
    const [bucket = "", ...rest] = location.slice("gs://".length).split("/");
    if (bucket === "") throw new UsageError(`no bucket in ${JSON.stringify(location)}`);
    const segments = rest.filter((s) => s !== "");
    if (segments.some((s) => s === "." || s === "..")) throw new UsageError(`"." or ".." segment in ${JSON.stringify(location)}`);
    const prefix = segments.join("/");
    return { kind: "gcs", bucket, prefix, url: prefix === "" ? `gs://${bucket}` : `gs://${bucket}/${prefix}` };
  }
  if (location.startsWith("file://")) return { kind: "local", path: fileURLToPath(location), url: location };
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(location)) {
    throw new UsageError(`unsupported URL scheme in ${JSON.stringify(location)} (use a local path, file:// or gs://)`);
  }
  return { kind: "local", path: location, url: location };
}

/** openStore's options for a location the command reads as input (a source): see GcsOptions.role. */
export const INPUT: GcsOptions = { role: "input" };

/**
 * A store for a location: `gs://bucket/prefix`, `file:///abs/path`, or a plain local path. The GCS client
 * is loaded only when a gs:// location is used (it adds a quarter second to every start otherwise).
 * GcsStore always receives the canonical prefix (see parseLocation); `gcs` sets its retries and timeouts.
 */
export async function openStore(location: string, gcs?: GcsOptions): Promise<Store> {
  const at = parseLocation(location);
  if (at.kind === "local") return new LocalStore(at.path, at.url);
  const { GcsStore, storageClient } = await import("./gcs.js");
  return gcs === undefined ? new GcsStore(at.bucket, at.prefix, at.url) : new GcsStore(at.bucket, at.prefix, at.url, storageClient(), gcs);
}

/**
 * Where a location really is, as a comparable string ending in "/": for GCS the canonical
 * `gs://bucket/prefix/`; locally the real path (symlinks resolved) of the deepest existing ancestor, with
 * the part that does not exist yet appended. Two locations that are the same place compare equal, and one
 * inside the other starts with it, however they were spelled.
 */
export async function resolveLocation(location: string): Promise<string> {
  const at = parseLocation(location);
  if (at.kind === "gcs") return `${at.url}/`;
  let existing = resolve(at.path);
  const missing: string[] = [];
  for (;;) {
    try {
      const real = await realpath(existing);
      return `${join(real, ...missing.reverse()).replace(/\/+$/, "")}/`;
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      const parent = dirname(existing);
      // ENOENT: not there yet; ENOTDIR: a file on the way (writing will fail; compare what there is).
      if ((code !== "ENOENT" && code !== "ENOTDIR") || parent === existing) throw e;
      missing.push(basename(existing));
      existing = parent;
    }
  }
}

/** Whether two resolved locations (resolveLocation) are the same place or one lies inside the other. */
export function overlaps(a: string, b: string): boolean {
  return a.startsWith(b) || b.startsWith(a);
}
