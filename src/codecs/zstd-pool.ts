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
 * worker and the frame's back, never copied; the caller bounds the chunks in flight. compressInto compresses from
 * and into the caller's SharedArrayBuffers, neither copied nor transferred, so that a command making thousands of
 * chunks reuses a few buffers: a fresh buffer for every chunk and frame cost a page fault every 4 KiB, and every
 * buffer transferred back counted as a new external allocation that brought the next garbage collection nearer.
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
    const src = new Uint8Array(m.buffer, m.offset, m.length);
    if (m.into !== undefined) {
      const n = cctx.compress2(new Uint8Array(m.into, m.intoOffset, m.intoLength), src);
      parentPort.postMessage({ id: m.id, length: n });
      return;
    }
    const dst = new Uint8Array(binding.compressBound(m.length));
    const n = cctx.compress2(dst, src);
    parentPort.postMessage({ id: m.id, frame: dst.buffer, length: n }, [dst.buffer]);
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

/** A worker's answer: the frame's length, and the frame itself unless it was written into the caller's buffer. */
interface Answer {
  readonly frame?: ArrayBuffer;
  readonly length: number;
}

interface Pending {
  readonly resolve: (answer: Answer) => void;
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
      worker.on("message", (m: Answer & { id: number; error?: string }) => {
        const p = this.pending.get(m.id);
        this.pending.delete(m.id);
        slot.busy--;
        if (m.error !== undefined) p?.reject(new Error(`zstd compression failed: ${m.error}`));
        else p?.resolve(m);
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
    const { frame, length } = await this.send({ buffer: data.buffer, offset: data.byteOffset, length: data.byteLength }, [
      data.buffer as ArrayBuffer,
    ]);
    return new Uint8Array(frame as ArrayBuffer, 0, length);
  }

  /**
   * The same frame as compress, written into `into` (at least compressBound(data.length) long): its first bytes,
   * returned. On worker threads both must be views of SharedArrayBuffers, which the worker reads and writes in
   * place: the caller must not touch either until this resolves.
   */
  async compressInto(data: Uint8Array, into: Uint8Array): Promise<Uint8Array> {
    if (this.failure !== undefined) throw this.failure;
    if (into.length < compressBound(data.length))
      throw new RangeError(`compressInto: ${into.length} bytes for a frame of up to ${compressBound(data.length)}`);
    if (this.workers.length === 0) {
      if (this.cctx === undefined) {
        this.cctx = new binding.CCtx();
        this.cctx.setParameter(binding.CParameter.compressionLevel, this.level);
      }
      return into.subarray(0, this.cctx.compress2(into, data));
    }
    if (!(data.buffer instanceof SharedArrayBuffer && into.buffer instanceof SharedArrayBuffer))
      throw new TypeError("compressInto on worker threads: the chunk and the frame's buffer must be SharedArrayBuffers");
    const { length } = await this.send(
      {
        buffer: data.buffer,
        offset: data.byteOffset,
        length: data.byteLength,
        into: into.buffer,
        intoOffset: into.byteOffset,
        intoLength: into.byteLength,
      },
      [],
    );
    return into.subarray(0, length);
  }

  private send(message: Record<string, unknown>, transfer: ArrayBuffer[]): Promise<Answer> {
    const slot = this.workers.reduce((a, b) => (b.busy < a.busy ? b : a));
    const id = this.next++;
    slot.busy++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      slot.worker.postMessage({ ...message, id }, transfer);
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
