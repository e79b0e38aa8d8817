import { createRequire } from "node:module";
import os from "node:os";
import { Worker } from "node:worker_threads";
import binding from "zstd-napi/binding.js";
import { compress } from "./zstd.js";

/**
 * zstd compression on worker threads: zstd-napi's `compress` is synchronous, and a command that makes every chunk
 * (import-hf) spent most of its main thread's CPU in it, so the reads, the transposes and the writes waited for it.
 * Each worker compresses as zstd.ts's `compress` does (same level, same frame, byte for byte). zstd's own threads
 * (ZSTD_c_nbWorkers, which zstd-napi exposes) would still hold the calling thread for the whole call, and one
 * 16 MiB chunk took 48 ms with 2 of them against 26 ms without. The chunk's ArrayBuffer is transferred to the
 * worker and the frame's back, never copied; the caller bounds the chunks in flight. With compressInto the caller
 * lends the frame's buffer too and gets both back, so that a command making thousands of chunks reuses a few
 * buffers instead of faulting in fresh pages for every chunk and its frame.
 */

/**
 * The worker's code, CommonJS evaluated as is (no file to find, the same from the sources under test and from
 * dist/): ZSTD_compress2 at the level on one context, as zstd-napi's `compress` does (so the same frame), the
 * frame transferred back in a buffer of its own.
 */
const WORKER = `
const { parentPort, workerData } = require("node:worker_threads");
const binding = require(workerData.binding);
const cctx = new binding.CCtx();
cctx.setParameter(binding.CParameter.compressionLevel, workerData.level);
parentPort.on("message", (m) => {
  try {
    const dst = m.into === undefined ? new Uint8Array(binding.compressBound(m.length)) : new Uint8Array(m.into);
    const n = cctx.compress2(dst, new Uint8Array(m.buffer, m.offset, m.length));
    const back = m.into === undefined ? [dst.buffer] : [dst.buffer, m.buffer];
    parentPort.postMessage({ id: m.id, frame: dst.buffer, length: n, input: m.buffer }, back);
  } catch (e) {
    parentPort.postMessage({ id: m.id, error: String((e && e.message) || e) });
  }
});
`;

/** The default pool: one worker a CPU, at most 4 (the chunks in flight are 4: more would idle). */
export function poolSize(): number {
  return Math.max(1, Math.min(4, os.availableParallelism()));
}

/** The most a zstd frame of `n` bytes takes (ZSTD_compressBound): what compressInto's buffer must hold. */
export function compressBound(n: number): number {
  return binding.compressBound(n);
}

/** A frame compressed into a lent buffer, and the chunk's buffer, both the caller's again. */
export interface Compressed {
  /** The frame: the first bytes of the buffer lent to compressInto (a new view of it: the old one was transferred). */
  readonly frame: Uint8Array;
  /** The chunk's whole buffer, back from the worker (the old view of it was transferred). */
  readonly input: ArrayBuffer;
}

interface Pending {
  readonly resolve: (done: { frame: Uint8Array; input: ArrayBuffer }) => void;
  readonly reject: (e: Error) => void;
}

export class CompressPool {
  private readonly workers: { worker: Worker; busy: number }[] = [];
  private readonly pending = new Map<number, Pending>();
  private next = 0;
  private failure: Error | undefined;
  private closing = false;
  /** compressInto's context on the calling thread, for a pool of no threads (made on first use). */
  private cctx: InstanceType<typeof binding.CCtx> | undefined;

  /** `size` 0 compresses on the calling thread (as zstd.ts's `compress`). */
  constructor(
    readonly size = poolSize(),
    private readonly level = 1,
  ) {
    const binding = createRequire(import.meta.url).resolve("zstd-napi/binding.js");
    for (let i = 0; i < size; i++) {
      const worker = new Worker(WORKER, { eval: true, workerData: { binding, level } });
      const slot = { worker, busy: 0 };
      worker.on("message", (m: { id: number; frame: ArrayBuffer; length: number; input: ArrayBuffer; error?: string }) => {
        const p = this.pending.get(m.id);
        this.pending.delete(m.id);
        slot.busy--;
        if (m.error !== undefined) p?.reject(new Error(`zstd compression failed: ${m.error}`));
        else p?.resolve({ frame: new Uint8Array(m.frame, 0, m.length), input: m.input });
      });
      worker.on("error", (e) => this.fail(e));
      worker.on("exit", (code) => {
        if (!this.closing) this.fail(new Error(`a zstd worker thread exited with code ${code}`));
      });
      this.workers.push(slot);
    }
  }

  /**
   * One zstd frame of `data` (as zstd.ts's `compress`). `data`'s ArrayBuffer is transferred to a worker: the
   * caller must not use it (nor any other view of that buffer) afterwards.
   */
  async compress(data: Uint8Array): Promise<Uint8Array> {
    if (this.failure !== undefined) throw this.failure;
    if (this.workers.length === 0) return compress(data, this.level);
    return (await this.send(data, undefined)).frame;
  }

  /**
   * The same frame as compress, written into `into` (whose whole buffer must hold compressBound(data.length)
   * bytes from its start); `data`'s buffer and `into`'s are both transferred to a worker and come back in the
   * answer: the caller must not use the views it passed (nor any other view of those buffers) meanwhile.
   */
  async compressInto(data: Uint8Array, into: ArrayBuffer): Promise<Compressed> {
    if (this.failure !== undefined) throw this.failure;
    if (into.byteLength < compressBound(data.length))
      throw new RangeError(`compressInto: ${into.byteLength} bytes for a frame of up to ${compressBound(data.length)}`);
    if (this.workers.length > 0) return this.send(data, into);
    if (this.cctx === undefined) {
      this.cctx = new binding.CCtx();
      this.cctx.setParameter(binding.CParameter.compressionLevel, this.level);
    }
    const n = this.cctx.compress2(new Uint8Array(into), data);
    return { frame: new Uint8Array(into, 0, n), input: data.buffer as ArrayBuffer };
  }

  private send(data: Uint8Array, into: ArrayBuffer | undefined): Promise<Compressed> {
    const slot = this.workers.reduce((a, b) => (b.busy < a.busy ? b : a));
    const id = this.next++;
    slot.busy++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      const message = { id, buffer: data.buffer, offset: data.byteOffset, length: data.byteLength, into };
      slot.worker.postMessage(message, into === undefined ? [data.buffer as ArrayBuffer] : [data.buffer as ArrayBuffer, into]);
    });
  }

  private fail(e: Error): void {
    this.failure ??= e;
    for (const p of this.pending.values()) p.reject(e);
    this.pending.clear();
  }

  async close(): Promise<void> {
    this.closing = true;
    await Promise.all(this.workers.map((w) => w.worker.terminate()));
    this.workers.length = 0;
  }
}
