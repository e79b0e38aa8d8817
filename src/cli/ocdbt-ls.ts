import { NotFoundError } from "../errors.js";
import { OcdbtDatabase } from "../ocdbt/database.js";
import { INPUT, openStore } from "../store/open.js";
import { table } from "./format.js";
import type { Output } from "./output.js";

export interface OcdbtLsRow {
  key: string;
  size: number;
  inline: boolean;
  /** Data file path relative to the database directory; null for inline values. */
  file: string | null;
  offset: number | null;
}

export async function runOcdbtLs(location: string, options: { prefix?: string; json?: boolean }, out: Output): Promise<number> {
  const store = await openStore(location, INPUT);
  // A mistyped path is said to be one, not that the manifest.ocdbt in it is missing.
  if ((await store.stat("manifest.ocdbt")) === undefined && (await store.listDir("")).absent) {
    throw new NotFoundError("does not exist", { path: store.url });
  }
  const db = await OcdbtDatabase.open(store);
  const rows: OcdbtLsRow[] = [];
  for await (const e of db.list(options.prefix ?? "")) {
    rows.push(
      e.value.kind === "inline"
        ? { key: e.key, size: e.value.bytes.length, inline: true, file: null, offset: null }
        : { key: e.key, size: e.value.length, inline: false, file: e.value.key, offset: e.value.offset },
    );
  }
  if (options.json) {
    out.stdout(JSON.stringify(rows, null, 2));
    return 0;
  }
  out.stdout(
    table(
      ["key", "size", "value"],
      rows.map((r) => [r.key, String(r.size), r.inline ? "inline" : `${r.file}@${r.offset}`]),
      new Set([1]),
      out.columns,
    ),
  );
  out.stdout(`${rows.length} keys, generation ${db.version?.generation ?? "none"}, ${db.stats.nodesRead} nodes read`);
  return 0;
}
