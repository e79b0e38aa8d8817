import os from "node:os";
import binding from "zstd-napi/binding.js";
import { WorkerPool } from "./worker-pool.js";
import { levelParams, type ZstdParams } from "./zstd.js";

/**
 * zstd compression on worker threads: zstd-napi's `compress` is synchronous, and a command that makes every chunk
 * (import-hf) spent most of its main thread's CPU in it, so the reads, the transposes and the writes waited for it.
 * Each worker compresses with the pool's parameters (levelParams(1): zstd.ts's `compress`, byte for byte). zstd's own threads
 * (ZSTD_c_nbWorkers, which zstd-napi exposes) would still hold the calling thread for the whole call, and one
 * 16 MiB chunk took 48 ms with 2 of them against 26 ms without. The chunk's ArrayBuffer is transferred to the
 * worker and the frame's back, never copied; the caller bounds the chunks in flight. compressInto compresses from
 * and into the caller's SharedArrayBuffers, neither copied nor transferred, so that a command making thousands of
 * chunks reuses a few buffers: a fresh buffer for every chunk and frame cost a page fault every 4 KiB, and every
 * buffer transferred back counted as a new external allocation that brought the next garbage collection nearer.
 */

/**
 * The worker's code (worker-pool.ts runs it): ZSTD_compress2 with the parameters on one context (a level alone:
 * as zstd-napi's `compress` does, so the same frame), the frame transferred back in a buffer of its own.
 */
const WORKER = `
const { parentPort, workerData } = require("node:worker_threads");
const binding = require(workerData.binding);
const cctx = new binding.CCtx();
for (const [param, value] of workerData.params) cctx.setParameter(param, value);
parentPort.on("message", (m) => {
  try {
    const src = new Uint8Array(m.buffer, m.offset, m.length);
    if (m.into !== undefined) {
      const n = cctx.compress2(new Uint8Array(m.into, m.intoOffset, m.intoLength), src);
      parentPort.postMessage({ slot: m.slot, length: n });
      return;
    }
    const dst = new Uint8Array(binding.compressBound(m.length));
    const n = cctx.compress2(dst, src);
    parentPort.postMessage({ slot: m.slot, frame: dst.buffer, length: n }, [dst.buffer]);
  } catch (e) {
    parentPort.postMessage({ slot: m.slot, error: String((e && e.message) || e) });
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
  readonly error?: string;
}

export class CompressPool {
  private readonly pool: WorkerPool<Answer>;
  /** compressInto's context on the calling thread, for a pool of no threads (made on first use). */
  private cctx: InstanceType<typeof binding.CCtx> | undefined;

  /** `size` 0 compresses on the calling thread. */
  constructor(
    readonly size = poolSize(),
    private readonly params: ZstdParams = levelParams(1),
  ) {
    this.pool = new WorkerPool<Answer>({ code: WORKER, threads: size, workerData: () => ({ params }) });
  }

  /** The calling thread's context, for a pool of no threads (made on first use). */
  private here(): InstanceType<typeof binding.CCtx> {
    if (this.cctx === undefined) {
      this.cctx = new binding.CCtx();
      for (const [param, value] of this.params) this.cctx.setParameter(param, value);
    }
    return this.cctx;
  }

  /**
   * One zstd frame of `data`. `data`'s ArrayBuffer is transferred to a worker: the caller must not use it (nor any
   * other view of that buffer) afterwards.
   */
  async compress(data: Uint8Array): Promise<Uint8Array> {
    if (this.pool.failure !== undefined) throw this.pool.failure;
    if (this.pool.threads === 0) {
      const frame = new Uint8Array(compressBound(data.length));
      return frame.subarray(0, this.here().compress2(frame, data));
    }
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
    if (this.pool.failure !== undefined) throw this.pool.failure;
    if (into.length < compressBound(data.length))
      throw new RangeError(`compressInto: ${into.length} bytes for a frame of up to ${compressBound(data.length)}`);
    if (this.pool.threads === 0) return into.subarray(0, this.here().compress2(into, data));
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
    return this.pool.request(message, transfer, (m) => {
      if (m.error !== undefined) throw new Error(`zstd compression failed: ${m.error}`);
      return m;
    });
  }

  close(): Promise<void> {
    return this.pool.close();
  }
}
