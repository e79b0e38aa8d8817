import { randomBytes } from "node:crypto";
import { crc32c } from "../codecs/crc32c.js";
import { MetadataError } from "../errors.js";
import { describe, joinKey, type ObjectInfo, type Store } from "../store/store.js";
import { mapLimited } from "../util/budget.js";
import type { PartRef, PlannedObject } from "./plan-format.js";
import { recordsDir } from "./work-dir.js";

/**
 * What was written, under which plan. Every writer (a convert-group task, a convert) appends the size and
 * CRC-32C of each object it wrote to records of its own under `.orbax2reg/records/<plan id>/`, so:
 * - an object counts as done only if a record of the plan on record vouches for it: objects left by a
 *   conversion whose plan was replaced (--force) are not, and
 * - resume and finalize compare the stored bytes with the checksum taken when they were written (GCS
 *   keeps a CRC-32C per object; a local file is read back), so a flipped byte is rewritten, not skipped.
 * Records are written in segments (many objects each, each written once), so writers never contend, and
 * kept per part of the plan (`<plan id>/<group>/<part>/`), so whoever checks a part reads only its records.
 */
/**
 * What a writer stored for one object: its size, and the CRC-32C of its bytes where the writer computed
 * one. A local-to-local verbatim copy does not (checksumming every byte would cost a third of the copy's
 * time, and the source is at hand): such an object is checked against its source instead, like an
 * unrecorded copy.
 */
export interface Recorded {
  readonly size: number;
  readonly crc32c?: number;
}

export type Records = ReadonlyMap<string, Recorded>;

/** A segment is written at most this often at first, and at most every twentieth of the time elapsed. */
const MIN_INTERVAL_MS = 100;
const MAX_INTERVAL_MS = 10_000;

/**
 * Segments read at once: small objects, and each a round trip of its own on GCS. A conversion of minutes writes
 * a dozen or so per part (the interval grows with the time elapsed), read back in one go.
 */
const READ_CONCURRENCY = 16;

interface Segment {
  readonly plan: string;
  /** [target, size, crc32c or null: compare with the source] */
  readonly objects: readonly (readonly [string, number, number | null])[];
}

/**
 * Collects a writer's records of the objects of part `part` and writes them out in segments: one in flight
 * at a time, the next as soon as records are pending and the interval has passed. A writer killed between writing an object and its
 * segment loses the record: that object is checked against its source or rewritten on resume.
 */
export class RecordLog {
  private readonly writer = randomBytes(4).toString("hex");
  private readonly started = Date.now();
  private pending: [string, number, number | null][] = [];
  private sequence = 0;
  private lastFlush = 0;
  private flushing: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;
  private failure: unknown;

  constructor(
    private readonly store: Store,
    private readonly stepDir: string,
    private readonly planId: string,
    private readonly part: PartRef,
  ) {}

  /** Records that `target`, an object of the log's part, was stored as `result`. */
  add(target: string, result: Recorded): void {
    if (this.failure !== undefined) throw this.failure;
    this.pending.push([target, result.size, result.crc32c ?? null]);
    this.schedule();
  }

  private schedule(): void {
    if (this.flushing !== undefined || this.timer !== undefined || this.pending.length === 0) return;
    const interval = Math.min(MAX_INTERVAL_MS, Math.max(MIN_INTERVAL_MS, (Date.now() - this.started) / 20));
    const wait = Math.max(0, this.lastFlush + interval - Date.now());
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.flushing = this.flush().finally(() => {
        this.flushing = undefined;
        this.schedule();
      });
    }, wait);
  }

  private async flush(): Promise<void> {
    const objects = this.pending;
    if (objects.length === 0) return;
    this.pending = [];
    this.lastFlush = Date.now();
    const name = `${this.writer}-${String(this.sequence++).padStart(6, "0")}.json`;
    const segment: Segment = { plan: this.planId, objects };
    try {
      await this.store.write(
        joinKey(this.stepDir, recordsDir(this.planId, this.part), name),
        new TextEncoder().encode(JSON.stringify(segment)),
      );
    } catch (e) {
      this.failure ??= e;
    }
  }

  /** Writes every pending record; fails if any segment could not be written. */
  async close(): Promise<void> {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    while (this.flushing !== undefined) await this.flushing;
    await this.flush();
    if (this.failure !== undefined) throw this.failure;
  }
}

/**
 * The records of part `part` of plan `planId` in the destination step (the last one wins for an object
 * written twice). Segments are read a few at a time; their order is the listing's.
 */
export async function readRecords(store: Store, stepDir: string, planId: string, part: PartRef): Promise<Map<string, Recorded>> {
  const out = new Map<string, Recorded>();
  {
    const prefix = `${joinKey(stepDir, recordsDir(planId, part))}/`;
    const keys: string[] = [];
    for await (const o of store.list(prefix)) keys.push(o.key);
    // A window of segments at a time: memory holds the records, not every segment's text at once.
    for (let i = 0; i < keys.length; i += READ_CONCURRENCY) {
      const segments = await mapLimited(keys.slice(i, i + READ_CONCURRENCY), READ_CONCURRENCY, (k) => readSegment(store, k, planId));
      for (const segment of segments)
        for (const [target, size, crc] of segment.objects) out.set(target, crc === null ? { size } : { size, crc32c: crc });
    }
  }
  return out;
}

async function readSegment(store: Store, key: string, planId: string): Promise<Segment> {
  const path = describe(store, key);
  let segment: Segment;
  try {
    segment = JSON.parse(new TextDecoder().decode(await store.read(key)));
  } catch (e) {
    if (e instanceof SyntaxError) throw new MetadataError(`record segment is not valid JSON (${e.message})`, { path });
    throw e;
  }
  if (segment?.plan !== planId || !Array.isArray(segment.objects)) throw new MetadataError("not a record segment of this plan", { path });
  return segment;
}

/**
 * The CRC-32C of an object as stored: the store's own (GCS) when the listing carries it, else computed
 * from the bytes read back (a local file).
 */
export async function storedCrc(store: Store, key: string, info: ObjectInfo): Promise<number> {
  if (info.crc32c !== undefined) return info.crc32c;
  let sum = 0;
  for await (const piece of store.readStream(key, 0, info.size)) sum = crc32c(piece, sum);
  return sum;
}

/** The CRC-32C a verbatim copy of `o` must have: its source bytes' (read again), or undefined if `o` is not a copy. */
export async function sourceCrc(source: Store, o: PlannedObject): Promise<number | undefined> {
  if (o.transform !== "copy") return undefined;
  const d = o.data;
  if (d.kind === "inline") return crc32c(Buffer.from(d.base64, "base64"));
  let sum = 0;
  for await (const piece of source.readStream(d.key, d.offset, d.length)) sum = crc32c(piece, sum);
  return sum;
}
