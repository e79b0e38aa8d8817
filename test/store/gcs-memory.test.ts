// A large object never sits in memory whole on the GCS path: a child process streams a 256 MiB generated object
// into fake-gcs-server through GcsStore.write, then reads it back through readStream; its peak RSS (the kernel's
// VmHWM: test/helpers/peak-rss.ts) is bounded. Holding the object whole, as Node's fetch does with a streamed request
// body (https://github.com/nodejs/undici/issues/4058), would take the child past 256 MiB; streamed, it stays near
// its base. The bound is generous: it catches a whole object, not a few MiB more. The child runs as every
// deployed process does (bin/orbax2reg.js's shebang, the job image's entry point): with node's default young
// generation instead, garbage not yet collected took it to 204 MiB on a loaded CI machine, holding nothing.
import { resolve } from "node:path";
import { beforeAll, describe, expect, inject, test } from "vitest";
import { newBucket } from "../helpers/gcs.js";
import { productRuntime, runWithPeakRss } from "../helpers/peak-rss.js";

const SIZE = 256 << 20;
const CHUNK = 16 << 20;
const BOUND_MIB = 200;

const child = `
import { GcsStore } from ${JSON.stringify(resolve("dist/src/store/gcs.js"))};
const [bucket, size, chunk] = process.argv.slice(1);
const store = new GcsStore(bucket, "memory", undefined, undefined, { chunkBytes: Number(chunk) });
const piece = new Uint8Array(1 << 20);
async function* generated() {
  for (let at = 0; at < Number(size); at += piece.length) {
    piece.fill(at >>> 20);
    yield piece.slice();
  }
}
const written = await store.write("big", generated());
let read = 0;
for await (const p of store.readStream("big", 0, written.size)) read += p.length;
console.log(JSON.stringify({ written: written.size, read }));
`;

describe("GcsStore's memory on a large object", () => {
  let bucket: string;
  beforeAll(async () => {
    bucket = await newBucket("memory");
  });

  test("a 256 MiB object written as a stream and read back as one is never held whole", () => {
    expect(productRuntime().flags.length, "the shebang names node's flags").toBeGreaterThan(0);
    const r = runWithPeakRss(["--input-type=module", "-e", child, bucket, String(SIZE), String(CHUNK)], {
      env: { ORBAX2REG_GCS_ENDPOINT: inject("gcsEndpoint") },
      timeoutMs: 240_000,
    });
    expect(r.stderr).toBe("");
    const out = JSON.parse(r.stdout) as { written: number; read: number };
    expect(out.written).toBe(SIZE);
    expect(out.read).toBe(SIZE);
    expect(r.peakMiB).toBeLessThan(BOUND_MIB);
  }, 300_000);
});
