import { isPermanent, MetadataError, NotFoundError } from "../errors.js";
import { INPUT, openStore } from "../store/open.js";
import { describe, readIfPresent, type Store } from "../store/store.js";
import { isWeightFile } from "./destination.js";
import { DEFAULT_EXPORT_MEMORY, decoderBytes, exportWindow, memoryPlan, openDecoders } from "./export.js";
import { planExport } from "./llama.js";
import { parseRecord, RECORD_NAME, sha256 } from "./record.js";
import { headerLength, type ParsedHeader, parseHeader, type SafetensorsDtype } from "./safetensors.js";
import { INDEX_NAME } from "./shards.js";
import { openExportSource } from "./source.js";
import { Cursors, outputBytes, produceInOrder } from "./stream.js";

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

/** Bytes compared at once, per band, at most. */
const VERIFY_BAND = 64 << 20;

/** Whether `location` holds an export (its index, the commit marker). */
export async function isExport(location: string): Promise<boolean> {
  const store = await openStore(location, INPUT);
  return (await store.stat(INDEX_NAME)) !== undefined;
}

/**
 * Checks an export against its source tensor by tensor: the index names exactly the tensors the source maps
 * to, in files that hold them with the planned shape, in BF16 or F32, and each tensor's bytes are the source's
 * mapped and cast again (streamed, layer by layer, as the export makes them); and the small files the export's
 * record names (config.json, generation_config.json...) hold the bytes it wrote, when the record is there (a
 * published copy may have left it out). A weight file beside the export that its index does not name fails it:
 * transformers may load it instead (`model.safetensors` comes before the index), an upload would publish it; so
 * does a temporary file an interrupted write left there.
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
  checks.push(...(await strayFiles(dest, new Set(Object.values(index.weightMap)))));
  checks.push(...(await recordedFiles(dest)));
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
  // The export's own default memory: decoders capped as it caps them.
  const decoders = openDecoders(plan.tensors);
  const window = exportWindow(source.location, decoders, DEFAULT_EXPORT_MEMORY);
  const memory = memoryPlan(decoders, DEFAULT_EXPORT_MEMORY, 0, decoderBytes(window));
  const cursors = new Cursors(memory.maxOpen, window);
  // A band of the source and the same bytes read back from the export: each half of the bands' share.
  const band = Math.max(1 << 20, Math.min(VERIFY_BAND, Math.floor(memory.maxBand / 2)));
  // The tensors the index lists, with their entry in their file's header; the others fail here.
  const listedTensors: { t: (typeof plan.tensors)[number]; file: string; begin: number; dataStart: number; dtype: SafetensorsDtype }[] = [];
  for (const t of plan.tensors) {
    const file = index.weightMap[t.name];
    if (file === undefined) continue;
    const problem = await (async (): Promise<string | undefined> => {
      const h = await header(file);
      const entry = h.tensors.find((e) => e.name === t.name);
      if (entry === undefined) return `not in ${file}'s header`;
      if (entry.shape.length !== t.shape.length || entry.shape.some((s, d) => s !== t.shape[d]))
        return `shape [${entry.shape}] in ${file}, the source gives [${t.shape}]`;
      if (listedTensors.length > 0 && listedTensors[0]?.dtype !== entry.dtype)
        return `${entry.dtype} in ${file}, the other tensors are ${listedTensors[0]?.dtype}`;
      listedTensors.push({ t, file, begin: entry.begin, dataStart: h.dataStart, dtype: entry.dtype });
      total += outputBytes(t, entry.dtype);
      return undefined;
    })().catch(permanentMessage);
    if (problem !== undefined) {
      firstDifference ??= t.name;
      checks.push({ name: t.name, ok: false, detail: problem });
    }
  }
  const dtype = listedTensors[0]?.dtype ?? "BF16";
  const where = new Map(listedTensors.map((x) => [x.t.name, x]));
  const differing = new Map<string, string>();
  let done = 0;
  try {
    for await (const piece of produceInOrder(
      listedTensors.map((x) => x.t),
      dtype,
      band,
      cursors,
    )) {
      const x = where.get(piece.t.name) as (typeof listedTensors)[number];
      if (!differing.has(x.t.name)) {
        const per = outputBytes(x.t, dtype) / (x.t.extent[x.t.bandDim] as number);
        const got = await dest.readRange(x.file, x.dataStart + x.begin + piece.u0 * per, piece.bytes.length).catch(permanentMessage);
        const at = typeof got === "string" ? -2 : firstDiff(piece.bytes, got);
        if (typeof got === "string") differing.set(x.t.name, got);
        else if (at >= 0)
          differing.set(
            x.t.name,
            `differs from the source (${dtype} byte ${piece.u0 * per + at} of ${outputBytes(x.t, dtype)}, in ${x.file})`,
          );
      }
      if (piece.last) {
        onTensor?.(++done, listedTensors.length);
        const problem = differing.get(x.t.name);
        if (problem !== undefined) firstDifference ??= x.t.name;
        checks.push(problem === undefined ? { name: x.t.name, ok: true } : { name: x.t.name, ok: false, detail: problem });
      }
    }
  } finally {
    await cursors.closeAll();
  }
  if (index.totalSize !== total && missing.length === 0)
    checks.push({ name: "metadata.total_size", ok: false, detail: `${index.totalSize}, the tensors hold ${total}` });
  const failed = checks.filter((c) => !c.ok).length;
  return { checks, passed: checks.length - failed, failed, ...(firstDifference === undefined ? {} : { firstDifference }) };
}

/** A failed check for each weight file (or index of weights) in the folder that the index does not name, and each leftover of an interrupted write. */
async function strayFiles(dest: Store, indexed: ReadonlySet<string>): Promise<Check[]> {
  const checks: Check[] = [];
  for (const info of (await dest.listDir("")).files) {
    const name = info.key.slice(info.key.lastIndexOf("/") + 1);
    if (name === INDEX_NAME || indexed.has(name) || !isWeightFile(name)) continue;
    const why =
      name === "model.safetensors"
        ? "transformers loads it instead of the index"
        : "another checkpoint's (export-hf --force removes it); an upload of the folder would publish it";
    checks.push({ name, ok: false, detail: `weights ${INDEX_NAME} does not name: ${why}` });
  }
  for (const key of (await dest.abandonedIn?.("")) ?? [])
    checks.push({
      name: key,
      ok: false,
      detail: "left by an interrupted write (export-hf removes it); an upload of the folder would publish it",
    });
  return checks;
}

/** A check of each small file the export's record names: there, with the bytes the export wrote. */
async function recordedFiles(dest: Store): Promise<Check[]> {
  const text = await readIfPresent(dest, RECORD_NAME);
  const record = text === undefined ? undefined : parseRecord(new TextDecoder().decode(text));
  const checks: Check[] = [];
  for (const f of record?.files ?? []) {
    if (f.sha256 === undefined) continue;
    const bytes = await readIfPresent(dest, f.name);
    if (bytes === undefined) checks.push({ name: f.name, ok: false, detail: `missing (${RECORD_NAME} names it)` });
    else if (sha256(bytes) !== f.sha256)
      checks.push({ name: f.name, ok: false, detail: `not the bytes the export wrote (its sha256 in ${RECORD_NAME} differs)` });
    else checks.push({ name: f.name, ok: true });
  }
  return checks;
}

/** A fault of the data (a short file, a bad header) fails the tensor; one of the storage fails the verification. */
function permanentMessage(e: unknown): string {
  if (!isPermanent(e)) throw e;
  return e.message;
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
