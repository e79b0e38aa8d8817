// A large object never sits in memory whole on the GCS path: a child process streams a 256 MiB generated object
// into fake-gcs-server through GcsStore.write, then reads it back through readStream, and reports its peak RSS
// (the kernel's VmHWM). Holding the object whole, as Node's fetch does with a streamed request body
// (https://github.com/nodejs/undici/issues/4058), would take the child past 256 MiB; streamed, it stays near
// its base. The bound is generous: it catches a whole object, not a few MiB more. The child runs as every
// deployed process does (bin/orbax2reg.js's shebang, the job image's entry point): with node's default young
// generation instead, garbage not yet collected took it to 204 MiB on a loaded CI machine, holding nothing.
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { beforeAll, describe, expect, inject, test } from "vitest";
import { newBucket } from "../helpers/gcs.js";

const SIZE = 256 << 20;
const CHUNK = 16 << 20;
const BOUND_MIB = 200;

/** The environment and node flags the CLI starts with: its shebang, `env -S VAR=value... node FLAGS`. */
function productRuntime(): { env: Record<string, string>; flags: string[] } {
  const [shebang = ""] = readFileSync("bin/orbax2reg.js", "utf8").split("\n");
  const words = shebang.replace(/^#!\/usr\/bin\/env -S /, "").split(" ");
  const node = words.indexOf("node");
  const env = Object.fromEntries(words.slice(0, node).map((w) => w.split("=", 2) as [string, string]));
  return { env, flags: words.slice(node + 1) };
}

const child = `
import { readFileSync } from "node:fs";
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
const hwm = Number(/VmHWM:\\s+(\\d+) kB/.exec(readFileSync("/proc/self/status", "utf8"))[1]);
console.log(JSON.stringify({ written: written.size, read, peakMiB: Math.round(hwm / 1024) }));
`;

describe("GcsStore's memory on a large object", () => {
  let bucket: string;
  beforeAll(async () => {
    bucket = await newBucket("memory");
  });

  test("a 256 MiB object written as a stream and read back as one is never held whole", () => {
    const runtime = productRuntime();
    expect(runtime.flags.length, "the shebang names node's flags").toBeGreaterThan(0);
    const r = spawnSync(process.execPath, [...runtime.flags, "--input-type=module", "-e", child, bucket, String(SIZE), String(CHUNK)], {
      env: { ...process.env, ...runtime.env, ORBAX2REG_GCS_ENDPOINT: inject("gcsEndpoint") },
      encoding: "utf8",
      timeout: 240_000,
    });
    expect(r.stderr).toBe("");
    const out = JSON.parse(r.stdout) as { written: number; read: number; peakMiB: number };
    expect(out.written).toBe(SIZE);
    expect(out.read).toBe(SIZE);
    expect(out.peakMiB).toBeLessThan(BOUND_MIB);
  }, 300_000);
});
