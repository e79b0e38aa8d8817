import { isPermanent, MetadataError, NotFoundError } from "../errors.js";
import { INPUT, openStore } from "../store/open.js";
import { describe, type Store } from "../store/store.js";
import { planExport } from "./llama.js";
import { headerLength, type ParsedHeader, parseHeader, type SafetensorsDtype } from "./safetensors.js";
import { INDEX_NAME } from "./shards.js";
import { openExportSource } from "./source.js";
import { bands, Cursors, outputBytes, produceBand } from "./stream.js";

export interface Check {
  readonly name: string;
  readonly ok: boolean;
  readonly detail?: string;
}

export interface ExportVerifyResult {
  readonly checks: Check[];
  readonly passed: number;
  readonly failed: number;
  /** The first tensor whose bytes differ, if any. */
  readonly firstDifference?: string;
}

/** Bytes compared at once, per band. */
const VERIFY_BAND = 64 << 20;

/** Whether `location` holds an export (its index, the commit marker). */
export async function isExport(location: string): Promise<boolean> {
  const store = await openStore(location, INPUT);
  return (await store.stat(INDEX_NAME)) !== undefined;
}

/**
 * Checks an export against its source tensor by tensor: the index names exactly the tensors the source maps
 * to, in files that hold them with the planned shape, in BF16 or F32, and each tensor's bytes are the source's
 * mapped and cast again (streamed, layer by layer, as the export makes them).
 */
export async function verifyExport(
  sourceLocation: string,
  destLocation: string,
  onTensor?: (done: number, total: number) => void,
): Promise<ExportVerifyResult> {
  const source = await openExportSource(sourceLocation);
  const plan = planExport(source.arrays, source.otherLeaves);
  const dest = await openStore(destLocation, INPUT);
  const checks: Check[] = [];
  let firstDifference: string | undefined;
  const index = await readIndex(dest);
  const expected = new Set(plan.tensors.map((t) => t.name));
  const listed = new Set(Object.keys(index.weightMap));
  const missing = [...expected].filter((n) => !listed.has(n));
  const extra = [...listed].filter((n) => !expected.has(n));
  checks.push(
    missing.length + extra.length === 0
      ? { name: INDEX_NAME, ok: true }
      : {
          name: INDEX_NAME,
          ok: false,
          detail: `${missing.length ? `missing ${missing.slice(0, 3).join(", ")}` : ""}${missing.length && extra.length ? "; " : ""}${extra.length ? `not from the source: ${extra.slice(0, 3).join(", ")}` : ""}`,
        },
  );
  const headers = new Map<string, ParsedHeader>();
  const header = async (file: string) => {
    let h = headers.get(file);
    if (h === undefined) {
      const n = headerLength(await dest.readRange(file, 0, 8), describe(dest, file));
      h = parseHeader(await dest.readRange(file, 0, 8 + n), describe(dest, file));
      headers.set(file, h);
    }
    return h;
  };
  let total = 0;
  const cursors = new Cursors();
  try {
    for (const [i, t] of plan.tensors.entries()) {
      onTensor?.(i, plan.tensors.length);
      const file = index.weightMap[t.name];
      if (file === undefined) continue;
      const problem = await (async (): Promise<string | undefined> => {
        const h = await header(file);
        const entry = h.tensors.find((e) => e.name === t.name);
        if (entry === undefined) return `not in ${file}'s header`;
        if (entry.shape.length !== t.shape.length || entry.shape.some((s, d) => s !== t.shape[d]))
          return `shape [${entry.shape}] in ${file}, the source gives [${t.shape}]`;
        const dtype: SafetensorsDtype = entry.dtype;
        total += outputBytes(t, dtype);
        const units = t.extent[t.bandDim] as number;
        const per = outputBytes(t, dtype) / units;
        for (const [u0, u1] of bands(t, dtype, VERIFY_BAND)) {
          const want = await produceBand(t, dtype, u0, u1, cursors);
          const got = await dest.readRange(file, h.dataStart + entry.begin + u0 * per, want.length);
          const at = firstDiff(want, got);
          if (at >= 0) return `differs from the source (${dtype} byte ${u0 * per + at} of ${entry.end - entry.begin}, in ${file})`;
        }
        return undefined;
      })().catch((e: unknown) => {
        if (!isPermanent(e)) throw e;
        return (e as Error).message;
      });
      if (problem !== undefined && firstDifference === undefined) firstDifference = t.name;
      checks.push(problem === undefined ? { name: t.name, ok: true } : { name: t.name, ok: false, detail: problem });
    }
  } finally {
    await cursors.closeAll();
  }
  onTensor?.(plan.tensors.length, plan.tensors.length);
  if (index.totalSize !== total && missing.length === 0)
    checks.push({ name: "metadata.total_size", ok: false, detail: `${index.totalSize}, the tensors hold ${total}` });
  const failed = checks.filter((c) => !c.ok).length;
  return { checks, passed: checks.length - failed, failed, ...(firstDifference === undefined ? {} : { firstDifference }) };
}

function firstDiff(a: Uint8Array, b: Uint8Array): number {
  if (Buffer.compare(a, b) === 0) return -1;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return i;
  return a.length;
}

async function readIndex(dest: Store): Promise<{ totalSize: number; weightMap: Record<string, string> }> {
  if ((await dest.stat(INDEX_NAME)) === undefined)
    throw new NotFoundError(`no ${INDEX_NAME}: not an export (or one that never finished)`, { path: dest.url });
  let json: { metadata?: { total_size?: unknown }; weight_map?: unknown };
  try {
    json = JSON.parse(new TextDecoder().decode(await dest.read(INDEX_NAME)));
  } catch (e) {
    throw new MetadataError(`not JSON (${(e as Error).message})`, { path: describe(dest, INDEX_NAME) });
  }
  const map = json.weight_map;
  if (
    typeof map !== "object" ||
    map === null ||
    !Object.values(map).every((v) => typeof v === "string" && /^[^/]+\.safetensors$/.test(v))
  ) {
    throw new MetadataError("weight_map must map tensor names to .safetensors files beside it", { path: describe(dest, INDEX_NAME) });
  }
  return { totalSize: Number(json.metadata?.total_size), weightMap: map as Record<string, string> };
}
