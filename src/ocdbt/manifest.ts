import type { ByteReader } from "./byte-reader.js";
import { decodeConfig, type OcdbtConfig } from "./config.js";
import { decodeDataFileTable } from "./data-file-table.js";
import { decodeVersionEntries, decodeVersionNodeRefs, type VersionEntry, type VersionNodeRef } from "./version-tree.js";

/**
 * A decoded manifest. A "numbered" manifest.ocdbt holds only the config; the versions then live in the
 * newest manifest.<16 hex> file, itself a single-kind manifest.
 */
export type Manifest =
  | { readonly kind: "config-only"; readonly config: OcdbtConfig }
  | {
      readonly kind: "versions";
      readonly config: OcdbtConfig;
      /** Newest last; the latest version of the database is the last entry. */
      readonly inlineVersions: VersionEntry[];
      readonly versionNodes: VersionNodeRef[];
    };

export function decodeManifest(r: ByteReader): Manifest {
  const config = decodeConfig(r);
  if (config.manifestKind === "numbered") {
    r.expectEnd("config-only manifest");
    return { kind: "config-only", config };
  }
  const files = decodeDataFileTable(r, "");
  const inlineVersions = decodeVersionEntries(r, files, config.versionTreeArityLog2);
  const versionNodes = decodeVersionNodeRefs(r, files, { inManifest: true }, Math.floor(63 / config.versionTreeArityLog2) - 1);
  r.expectEnd("manifest");
  return { kind: "versions", config, inlineVersions, versionNodes };
}

/** The newest version: the last inline version (empty inline versions means a database with no commits). */
export function latestVersion(m: Manifest & { kind: "versions" }): VersionEntry | undefined {
  return m.inlineVersions[m.inlineVersions.length - 1];
}
