import { FRAME_HEADER_MAX } from "../codecs/zstd.js";
import { DEFAULT_CONCURRENCY, DEFAULT_MEMORY_MIB } from "../defaults.js";
import { ConflictError, FormatError } from "../errors.js";
import { joinKey, type Store } from "../store/store.js";
import { Budget, mapLimited } from "../util/budget.js";
import { parseZarrMetadata, type ZarrArrayMeta } from "../zarr/metadata.js";
import { type Batch, coalesce, sliceOf } from "./coalesce.js";
import { checkObjects, listTargets, type Verdict } from "./done.js";
import { OwnerWatch, retreat } from "./ownership.js";
import { dataLength, type ExecutionPlan, type PartRef, type PlannedObject } from "./plan-format.js";
import { type Recorded, RecordLog } from "./records.js";
import { CAST_WHOLE_MAX, checkFrameHeader, HANDLERS, type Run, STREAM_RESERVE } from "./transforms.js";

export interface ExecuteOptions {
  /** Objects in flight at once. */
  readonly concurrency: number;
  /** Upper bound on bytes buffered in memory at once (reads, decodes, encodes). */
  readonly memoryBytes: number;
  /** Largest chunk (decoded bytes) a cast does whole, larger ones streamed; CAST_WHOLE_MAX unless given (tests). */
  readonly castWholeMax?: number;
  /** Called after each object with the bytes it accounts for. */
  readonly onObject?: (event: { target: string; bytes: number; skipped: boolean }) => void;
  /**
   * Filled with what this process wrote or checked (target -> size and CRC-32C), so that a finalize in the
   * same process need not read those objects back.
   */
  readonly trusted?: Map<string, Recorded>;
}

/** Where the objects of one executeObjects call are in the plan: their records go there, and only its are read. */
export interface ExecutePart {
  readonly part: PartRef;
}

/**
 * Writes of batched small objects in flight per object slot: enough to keep a local disk's many small writes
 * overlapping (as before this bound, when the local store's own pool of 128 was the only one), few enough
 * that GCS sees at most `concurrency` times this many connections.
 */
const WRITES_PER_SLOT = 8;

export const DEFAULT_EXECUTE: ExecuteOptions = { concurrency: DEFAULT_CONCURRENCY, memoryBytes: DEFAULT_MEMORY_MIB << 20 };

export interface ExecuteReport {
  objects: number;
  written: number;
  skipped: number;
  bytesWritten: number;
  seconds: number;
}

/**
 * Writes `objects` (part `options.part` of the plan, or a slice of it) into the destination step. Objects already present with
 * their planned size are skipped, so a crashed or repeated run resumes. Each object is made by its
 * transform's handler (transforms.ts); small ranges of one data file are read together (coalesce.ts);
 * large objects stream from the ranged read to the write; a byte budget bounds memory.
 */
export async function executeObjects(
  plan: ExecutionPlan,
  objects: readonly PlannedObject[],
  source: Store,
  destination: Store,
  options: ExecuteOptions & ExecutePart,
): Promise<ExecuteReport> {
  const started = Date.now();
  const writer = new Writer(plan, source, destination, options, objects.length);
  // The first look at who holds the step goes out with the listing, not after it: the first object reuses it.
  writer.lookAtOwner();
  const todo: PlannedObject[] = [];
  // Only the directories this run writes to, and only its part's records: a part's cost is its own.
  const existing = await listTargets(destination, plan.destination.stepDir, objects);
  const verdicts = await checkObjects(plan, objects, source, destination, existing, {
    concurrency: options.concurrency,
    adopt: true,
    part: options.part,
  });
  objects.forEach((o, i) => {
    const v = verdicts[i] as Verdict;
    if ("done" in v) writer.skipped(o, v.done, v.recorded);
    else todo.push(o);
  });
  // Started one slot at a time: in flight and in memory are `concurrency` tasks, not one per object.
  for (const item of coalesce(todo)) {
    if (!(await writer.start("objects" in item ? () => writer.batch(item) : () => writer.one(item)))) break;
  }
  const report = await writer.finish();
  report.seconds = (Date.now() - started) / 1000;
  return report;
}

/** One executeObjects call: the budgets, the records, the report, and what it wrote (to retreat from). */
class Writer {
  readonly report: ExecuteReport;
  private readonly stepDir: string;
  private readonly log: RecordLog;
  private readonly owner: OwnerWatch;
  private readonly slots: Budget;
  private readonly memory: Budget;
  /** Writes of batched objects in flight, across all batches. */
  private readonly writes: Budget;
  private readonly run: Run;
  private readonly metas = new Map<number, ZarrArrayMeta>();
  private readonly wrote: string[] = [];
  private failed = false;
  /** Tasks started and not yet settled; the first failure among all of them. */
  private readonly running = new Set<Promise<void>>();
  private failure: { reason: unknown } | undefined;

  constructor(
    private readonly plan: ExecutionPlan,
    source: Store,
    private readonly destination: Store,
    private readonly options: ExecuteOptions & ExecutePart,
    objects: number,
  ) {
    this.stepDir = plan.destination.stepDir;
    this.log = new RecordLog(destination, this.stepDir, plan.id, options.part);
    this.owner = new OwnerWatch(destination, plan);
    this.slots = new Budget(options.concurrency);
    this.memory = new Budget(options.memoryBytes);
    this.writes = new Budget(options.concurrency * WRITES_PER_SLOT);
    this.report = { objects, written: 0, skipped: 0, bytesWritten: 0, seconds: 0 };
    this.run = {
      source,
      stepDir: this.stepDir,
      copy: source.rangeCopyTo?.(destination),
      buffers: [],
      // Never more than the whole budget: a write given less buffers less (GCS: smaller chunks).
      streamReserve: Math.min(options.memoryBytes, Math.max(STREAM_RESERVE, destination.writeBuffer ?? 0)),
      castWholeMax: options.castWholeMax ?? CAST_WHOLE_MAX,
      meta: (o) => this.meta(o),
      castTo: (o) => this.plan.arrays[o.array as number]?.castTo,
    };
  }

  /** An object already in place: recorded (unless a record already says so) and trusted, not written. */
  skipped(o: PlannedObject, result: Recorded, recorded: boolean): void {
    this.done(o, result, recorded);
    this.report.skipped++;
    this.options.onObject?.({ target: o.target, bytes: dataLength(o.data), skipped: true });
  }

  /** Makes and writes one object with its transform's handler. */
  async one(o: PlannedObject): Promise<void> {
    const job = HANDLERS[o.transform](this.run, o);
    return this.withBudget(job.weight, async () => {
      const out = await job.run();
      if ("stored" in out) this.written(o, out.bytes, out.stored);
      else await this.put(o, out.data, out.bytes, job.buffer ?? job.weight);
    });
  }

  /** Writes a batch of small verbatim copies from one read of their source. */
  batch(batch: Batch): Promise<void> {
    return this.withBudget(batch.span, async () => {
      const bytes = await this.run.source.readRange(batch.key, batch.offset, batch.span);
      // Every chunk's frame header is checked before any of them is written.
      for (const o of batch.objects) checkFrameHeader(this.run, o)?.(sliceOf(batch, bytes, o).subarray(0, FRAME_HEADER_MAX));
      // A batch may hold thousands of objects: their writes share the writer's bound (a write to GCS is a
      // connection; unbounded, one batch of 2 KiB chunks opened thousands).
      await mapLimited(batch.objects, this.options.concurrency, (o) =>
        this.writes.acquire().then((release) => this.put(o, sliceOf(batch, bytes, o), dataLength(o.data)).finally(release)),
      );
    });
  }

  /**
   * Starts `task` once one of the `concurrency` slots is free; false once a task has failed (nothing more
   * is started: the run is going to fail anyway).
   */
  async start(task: () => Promise<void>): Promise<boolean> {
    const releaseSlot = await this.slots.acquire();
    if (this.failure !== undefined) {
      releaseSlot();
      return false;
    }
    const running: Promise<void> = task()
      .catch((e) => {
        this.failure ??= { reason: e };
      })
      .finally(() => {
        releaseSlot();
        this.running.delete(running);
      });
    this.running.add(running);
    return true;
  }

  /**
   * Waits for every started task to settle; the first failure is the error the caller sees. What was written
   * until then is recorded either way, so a re-run resumes from it; after a takeover, what we wrote is removed.
   */
  async finish(): Promise<ExecuteReport> {
    while (this.running.size > 0) await Promise.all([...this.running]);
    const closed = this.log.close();
    if (this.failure !== undefined) {
      await closed.catch(() => undefined);
      const reason = this.failure.reason;
      if (reason instanceof ConflictError) await retreat(this.destination, this.stepDir, this.wrote);
      throw reason;
    }
    await closed;
    return this.report;
  }

  /** Starts a look at who holds the step, for the first object to find done (a failure is its to report). */
  lookAtOwner(): void {
    this.owner.check().catch(() => undefined);
  }

  /** Runs `work` (the caller holds a slot) once `weight` bytes of the memory budget are free. */
  private async withBudget(weight: number, work: () => Promise<void>): Promise<void> {
    const releaseMemory = await this.memory.acquire(weight);
    try {
      // After the first failure, queued objects are not started: the run is going to fail anyway. Nor
      // are they once another conversion has taken the step over.
      if (!this.failed)
        await this.owner
          .check()
          .then(work)
          .catch((e) => {
            this.failed = true;
            throw e;
          });
    } finally {
      releaseMemory();
    }
  }

  /** `bytes` undefined: what the write stored (a stream of a length unknown until written). */
  private async put(
    o: PlannedObject,
    data: Uint8Array | AsyncIterable<Uint8Array>,
    bytes: number | undefined,
    bufferBytes?: number,
  ): Promise<void> {
    const options = bufferBytes === undefined ? {} : { bufferBytes };
    const result = await this.destination.write(joinKey(this.stepDir, o.target), data, options);
    this.written(o, bytes ?? result.size, result);
  }

  private written(o: PlannedObject, bytes: number, result: Recorded): void {
    this.wrote.push(o.target);
    this.done(o, result);
    this.report.written++;
    this.report.bytesWritten += bytes;
    this.options.onObject?.({ target: o.target, bytes: dataLength(o.data), skipped: false });
  }

  private done(o: PlannedObject, result: Recorded, recorded = false): void {
    if (!recorded) this.log.add(o.target, result);
    this.options.trusted?.set(o.target, result);
  }

  private meta(o: PlannedObject): ZarrArrayMeta {
    const i = o.array as number;
    let m = this.metas.get(i);
    if (m === undefined) {
      const a = this.plan.arrays[i];
      if (a === undefined) {
        throw new FormatError(`plan object ${o.target} names array ${i}, which the plan lacks`, {
          path: `${this.plan.destination.root}/${this.stepDir}`,
        });
      }
      m = parseZarrMetadata(a.sourceMetadataKind, Buffer.from(a.sourceMetadata), { path: `${this.plan.source.root} (plan)`, key: a.name });
      this.metas.set(i, m);
    }
    return m;
  }
}
