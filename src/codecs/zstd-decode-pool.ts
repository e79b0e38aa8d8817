import os from "node:os";
import { WorkerPool } from "./worker-pool.js";
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
 * The worker's code (worker-pool.ts runs it, one request in each of its slots at most): ChunkDecoder's loop on
 * one context, into the request's slot and then one byte past the chunk (where a longer frame would write); `ok`
 * only for one frame that ends exactly at the input's end having decoded exactly `size` bytes.
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
  parentPort.postMessage({ slot: m.slot, ok });
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

export class DecodePool {
  private readonly pool: WorkerPool<{ readonly ok: boolean }>;
  /** Each worker's output slots, as this thread reads them. */
  private readonly slots: Uint8Array[][];

  /**
   * `threads` 0 decodes on the calling thread; chunks of more than `maxBytes` decoded are always decoded there.
   * Idle workers do not keep the process alive (a pool nobody closes, as the shared one, lets the process end):
   * a worker is referenced only while it decodes.
   */
  constructor(
    readonly maxBytes: number,
    threads = decodePoolSize(),
  ) {
    const buffers = Array.from({ length: threads }, () => Array.from({ length: SLOTS_PER_WORKER }, () => new SharedArrayBuffer(maxBytes)));
    this.slots = buffers.map((slots) => slots.map((b) => new Uint8Array(b)));
    this.pool = new WorkerPool({
      code: WORKER,
      threads,
      workerData: (i) => ({ windowLogMax: WINDOW_LOG_MAX, slots: buffers[i] }),
      // Its heap holds little: a small young generation keeps the collector from saving up the compressed
      // buffers' handles (the memory stays the caller's to reuse, but one it gave up is freed only then).
      resourceLimits: { maxYoungGenerationSizeMb: 1 },
      slots: SLOTS_PER_WORKER,
      unrefIdle: true,
    });
  }

  /**
   * The chunk `frame` holds, decoded as decodeChunkFrame decodes it (its errors, named by `path`, too), into a
   * buffer of its own. A frame in a SharedArrayBuffer is decoded by a worker (the caller must not write that
   * memory until the promise settles), any other on the calling thread.
   */
  decode(frame: Uint8Array, size: number, path: string, bf16 = false): Promise<Uint8Array> {
    if (this.pool.failure !== undefined) return Promise.reject(this.pool.failure);
    if (this.pool.threads === 0 || size > this.maxBytes || !(frame.buffer instanceof SharedArrayBuffer)) {
      try {
        return Promise.resolve(decodeHere(frame, size, path, bf16));
      } catch (e) {
        return Promise.reject(e);
      }
    }
    const { buffer, byteOffset: offset, byteLength: length } = frame;
    return this.pool.request({ buffer, offset, length, size, bf16 }, [], ({ ok }, { worker, slot }) => {
      // Refused by the worker: decoded here, where a bad chunk throws decodeChunkFrame's own error.
      if (!ok) return decodeHere(frame, size, path, bf16);
      // Not zero-filled first: every byte is copied over.
      const n = bf16 ? size >>> 1 : size;
      const out = new Uint8Array(Buffer.allocUnsafeSlow(n).buffer, 0, n);
      out.set(((this.slots[worker] as Uint8Array[])[slot] as Uint8Array).subarray(0, n));
      return out;
    });
  }

  close(): Promise<void> {
    return this.pool.close();
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
