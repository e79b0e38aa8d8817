import { createRequire } from "node:module";
import os from "node:os";
import { Worker } from "node:worker_threads";
import { decodeChunkFrame } from "./zstd.js";

/**
 * Whole zstd chunks decoded on worker threads: export-hf's main thread lays out every decoded element (the copy
 * into the output tensors), and a source cut 1,024 ways decodes 5,134 small chunks as well, all on that one thread,
 * while the machine's other cores idled. A worker decodes a chunk as zstd.ts's decodeChunkFrame does (exactly one
 * frame of exactly `size` bytes); anything else it refuses, and the chunk is decoded again on the calling thread by
 * decodeChunkFrame itself, so a bad chunk fails with that function's error, whatever the thread.
 *
 * Memory: the compressed bytes are shared (a SharedArrayBuffer the caller reads into and reuses), and each worker
 * decodes into a few output slots of its own, shared too and made once, which the calling thread copies into a
 * buffer of its own (a memcpy, a fifth of a decode). Not a buffer made or transferred per chunk: a chunk's
 * buffer transferred from a worker was not counted by the calling thread's heap, and a SharedArrayBuffer per
 * chunk was held by the worker's heap too; either way a source's worth of decoded chunks waited for a garbage
 * collector (peak RSS 940 and 490-570 MiB cut 1,024 ways, against 310: bench/README.md, "--cuts").
 */

/**
 * The first `n` float32 elements of `bytes` (4-byte aligned) as bfloat16, in place (element i's two bytes trail
 * its four): zarr/cast.ts's bf16Bits, round to nearest even, NaN to a quiet NaN of its sign. The worker runs this
 * very function (its source is part of the worker's code), and so does the calling thread when it decodes.
 */
function castInPlace(bytes: Uint8Array, n: number): void {
  const src = new Int32Array(bytes.buffer, bytes.byteOffset, n);
  const out = new Uint16Array(bytes.buffer, bytes.byteOffset, n);
  for (let i = 0; i < n; i++) {
    const u = src[i] as number;
    const hi = u >>> 16;
    out[i] = (u & 0x7fffffff) > 0x7f800000 ? (hi & 0x8000) | 0x7fc0 : (hi + (((u & 0xffff) + 0x7fff + (hi & 1)) >>> 16)) & 0xffff;
  }
}

/**
 * The worker's code, CommonJS evaluated as is (no file to find, the same from the sources under test and from
 * dist/), as zstd-pool.ts's: ChunkDecoder's loop on one context, into a slot and then one byte past the chunk
 * (where a longer frame would write); `ok` only for one frame that ends exactly at the input's end having decoded
 * exactly `size` bytes.
 */
const WORKER = `
const { parentPort, workerData } = require("node:worker_threads");
const binding = require(workerData.binding);
const dctx = new binding.DCtx();
dctx.setParameter(binding.DParameter.windowLogMax, workerData.windowLogMax);
const slots = workerData.slots.map((b) => new Uint8Array(b));
const past = new Uint8Array(1);
function decode(src, out) {
  const size = out.length;
  let decoded = 0;
  let consumed = 0;
  for (;;) {
    const dst = decoded < size ? out.subarray(decoded) : past;
    const [remaining, produced, used] = dctx.decompressStream(dst, src.subarray(consumed));
    consumed += used;
    decoded += produced;
    if (decoded > size) return false;
    if (remaining === 0) return decoded === size && consumed === src.length;
    if (consumed === src.length && produced < dst.length) return false;
  }
}
${castInPlace.toString()}
parentPort.on("message", (m) => {
  let ok;
  try {
    ok = decode(new Uint8Array(m.buffer, m.offset, m.length), slots[m.slot].subarray(0, m.size));
  } catch {
    ok = false;
  }
  if (!ok) dctx.reset(binding.ResetDirective.sessionOnly);
  else if (m.bf16) castInPlace(slots[m.slot], m.size >>> 2);
  parentPort.postMessage({ id: m.id, ok });
});
`;

/** TensorStore's window limit, as zstd.ts's decoder sets it (WINDOW_LOG_MAX there). */
const WINDOW_LOG_MAX = 31;
/** Output slots a worker has: one chunk decoded while the calling thread copies out another, and a few queued. */
const SLOTS_PER_WORKER = 4;

/**
 * One worker fewer than the CPUs, at least one, at most 2: the calling thread has its own work (the layout copy,
 * the reads' completions) and a worker decodes faster than one thread reads and lays out.
 */
export function decodePoolSize(): number {
  return Math.max(1, Math.min(2, os.availableParallelism() - 1));
}

interface Job {
  readonly frame: Uint8Array;
  readonly size: number;
  readonly bf16: boolean;
  readonly path: string;
  readonly resolve: (decoded: Uint8Array) => void;
  readonly reject: (e: Error) => void;
}

interface Thread {
  readonly worker: Worker;
  readonly slots: Uint8Array[];
  /** Slots not decoding. */
  readonly free: number[];
  /** The job each busy slot decodes. */
  readonly jobs: (Job | undefined)[];
}

export class DecodePool {
  private readonly threads: Thread[] = [];
  /** Jobs waiting for a free slot, oldest first. */
  private readonly queue: Job[] = [];
  private failure: Error | undefined;
  private closing = false;

  /**
   * `threads` 0 decodes on the calling thread; chunks of more than `maxBytes` decoded are always decoded there.
   * Idle workers do not keep the process alive (a pool nobody closes, as the shared one, lets the process end):
   * a worker is referenced only while it decodes.
   */
  constructor(
    readonly maxBytes: number,
    threads = decodePoolSize(),
  ) {
    const binding = createRequire(import.meta.url).resolve("zstd-napi/binding.js");
    for (let i = 0; i < threads; i++) {
      const buffers = Array.from({ length: SLOTS_PER_WORKER }, () => new SharedArrayBuffer(maxBytes));
      const worker = new Worker(WORKER, {
        eval: true,
        workerData: { binding, windowLogMax: WINDOW_LOG_MAX, slots: buffers },
        // Its heap holds little: a small young generation keeps the collector from saving up the compressed
        // buffers' handles (the memory stays the caller's to reuse, but one it gave up is freed only then).
        resourceLimits: { maxYoungGenerationSizeMb: 1 },
      });
      worker.unref();
      const thread: Thread = {
        worker,
        slots: buffers.map((b) => new Uint8Array(b)),
        free: buffers.map((_, k) => k),
        jobs: buffers.map(() => undefined),
      };
      worker.on("message", (m: { id: number; ok: boolean }) => this.done(thread, m.id, m.ok));
      worker.on("error", (e) => this.fail(e));
      worker.on("exit", (code) => {
        if (!this.closing) this.fail(new Error(`a zstd worker thread exited with code ${code}`));
      });
      this.threads.push(thread);
    }
  }

  /**
   * The chunk `frame` holds, decoded as decodeChunkFrame decodes it (its errors, named by `path`, too), into a
   * buffer of its own. A frame in a SharedArrayBuffer is decoded by a worker (the caller must not write that
   * memory until the promise settles), any other on the calling thread.
   */
  decode(frame: Uint8Array, size: number, path: string, bf16 = false): Promise<Uint8Array> {
    if (this.failure !== undefined) return Promise.reject(this.failure);
    if (this.threads.length === 0 || size > this.maxBytes || !(frame.buffer instanceof SharedArrayBuffer)) {
      try {
        return Promise.resolve(decodeHere(frame, size, path, bf16));
      } catch (e) {
        return Promise.reject(e);
      }
    }
    return new Promise((resolve, reject) => {
      this.queue.push({ frame, size, bf16, path, resolve, reject });
      this.dispatch();
    });
  }

  /** Hands queued jobs to free slots, the least busy worker first. */
  private dispatch(): void {
    while (this.queue.length > 0) {
      let thread: Thread | undefined;
      for (const t of this.threads) if (t.free.length > (thread?.free.length ?? 0)) thread = t;
      if (thread === undefined) return;
      const job = this.queue.shift() as Job;
      const slot = thread.free.pop() as number;
      if (thread.free.length === SLOTS_PER_WORKER - 1) thread.worker.ref();
      thread.jobs[slot] = job;
      const { buffer, byteOffset: offset, byteLength: length } = job.frame;
      thread.worker.postMessage({ id: slot, buffer, offset, length, size: job.size, slot, bf16: job.bf16 });
    }
  }

  private done(thread: Thread, slot: number, ok: boolean): void {
    const job = thread.jobs[slot];
    thread.jobs[slot] = undefined;
    if (job === undefined) return;
    try {
      if (ok) {
        // Not zero-filled first: every byte is copied over.
        const n = job.bf16 ? job.size >>> 1 : job.size;
        const out = new Uint8Array(Buffer.allocUnsafeSlow(n).buffer, 0, n);
        out.set((thread.slots[slot] as Uint8Array).subarray(0, n));
        job.resolve(out);
      } else {
        // Refused by the worker: decoded here, where a bad chunk throws decodeChunkFrame's own error.
        job.resolve(decodeHere(job.frame, job.size, job.path, job.bf16));
      }
    } catch (e) {
      job.reject(e as Error);
    }
    thread.free.push(slot);
    if (thread.free.length === SLOTS_PER_WORKER) thread.worker.unref();
    this.dispatch();
  }

  private fail(e: Error): void {
    this.failure ??= e;
    for (const t of this.threads)
      for (const [k, job] of t.jobs.entries()) {
        job?.reject(e);
        t.jobs[k] = undefined;
      }
    for (const job of this.queue.splice(0)) job.reject(e);
  }

  async close(): Promise<void> {
    this.closing = true;
    await Promise.all(this.threads.map((t) => t.worker.terminate()));
    this.threads.length = 0;
  }
}

/** decodeChunkFrame, then the worker's cast. */
function decodeHere(frame: Uint8Array, size: number, path: string, bf16: boolean): Uint8Array {
  const decoded = decodeChunkFrame(frame, size, path);
  if (!bf16) return decoded;
  castInPlace(decoded, size >>> 2);
  return decoded.subarray(0, size >>> 1);
}

let shared: DecodePool | undefined;

/** The process's pool, made on first use for chunks of at most `maxBytes` (its idle workers keep nothing alive). */
export function sharedDecodePool(maxBytes: number): DecodePool {
  shared ??= new DecodePool(maxBytes);
  return shared;
}
