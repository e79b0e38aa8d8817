import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import https from "node:https";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
// @ts-expect-error: a benchmark's helper, plain JavaScript
import { createBucket, nginxPath, startEmulator, startTlsTerminator, upload } from "../../bench/fake-gcs.mjs";
import { removeScratch, scratch } from "../helpers/convert.js";
import { clientTls } from "../helpers/tls.mjs";

// bench/fake-gcs.mjs's emulator, started by a stand-in benchmark that writes an object and then waits (or
// fails): however the benchmark ends, the emulator stops and its filesystem backend's folder is removed.

afterAll(() => removeScratch());

const BENCHMARK = `
const { createBucket, startEmulator, upload } = await import("./bench/fake-gcs.mjs");
const { url } = await startEmulator(process.argv[1]);
await createBucket(url, "bench");
await upload(url, "bench", "o", new Uint8Array(1000));
console.log(url);
if (process.argv[2] === "fail") throw new Error("the benchmark failed");
setInterval(() => {}, 1000);
`;

/** Runs the stand-in until it prints the emulator's URL, then `end`s it; its exit code and that URL. */
function run(root: string, end: "SIGINT" | "SIGTERM" | "fail"): Promise<{ code: number | null; url: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--input-type=module", "-e", BENCHMARK, root, end], { stdio: ["ignore", "pipe", "pipe"] });
    let url = "";
    child.stdout.on("data", (b: Buffer) => {
      url += b.toString();
      if (url.endsWith("\n") && end !== "fail") {
        expect(existsSync(root)).toBe(true);
        child.kill(end);
      }
    });
    child.once("error", reject);
    child.once("exit", (code) => resolve({ code, url: url.trim() }));
  });
}

describe("the benchmarks' fake-gcs-server", () => {
  test.each([
    ["SIGINT", 130],
    ["SIGTERM", 143],
    ["fail", 1],
  ] as const)("a benchmark ended by %s (exit %i) stops the emulator and removes its folder", async (end, code) => {
    const root = join(scratch("fake-gcs"), "fs");
    const r = await run(root, end);
    expect(r.code).toBe(code);
    expect(r.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/); // HTTPS, as GCS serves
    expect(existsSync(root)).toBe(false);
    await expect(fetch(`${r.url}/storage/v1/b`)).rejects.toThrow();
  });
});

describe("an emulator stopped before the benchmark ends", () => {
  test("takes its signal handlers with it: only the running one's remain, so a signal waits for that one", async () => {
    const script = `
const { startEmulator } = await import("./bench/fake-gcs.mjs");
const first = await startEmulator(process.argv[1]);
first.stop();
await first.exited;
await new Promise((r) => setImmediate(r));
const stopped = process.listenerCount("SIGTERM");
const second = await startEmulator(process.argv[1], { keep: true });
console.log(JSON.stringify({ stopped, running: process.listenerCount("SIGTERM") }));
second.stop();
`;
    const root = join(scratch("fake-gcs-restart"), "fs");
    const out = await new Promise<string>((resolve, reject) => {
      const child = spawn(process.execPath, ["--input-type=module", "-e", script, root], { stdio: ["ignore", "pipe", "inherit"] });
      let text = "";
      child.stdout.on("data", (b: Buffer) => {
        text += b.toString();
      });
      child.once("error", reject);
      child.once("exit", () => resolve(text));
    });
    expect(JSON.parse(out)).toEqual({ stopped: 0, running: 1 });
  });
});

const NGINX = nginxPath();

describe.skipIf(NGINX === undefined)("the benchmark's TLS terminator (nginx in front of the emulator)", () => {
  test("passes a download on in records larger than one 4 KiB page, as a server sending bulk data does", async () => {
    const root = join(scratch("fake-gcs-tls"), "fs");
    const emulator = await startEmulator(root, { plain: true });
    const tls = await startTlsTerminator(emulator.plainUrl, NGINX);
    try {
      await createBucket(emulator.plainUrl, "bench");
      await upload(emulator.plainUrl, "bench", "o", new Uint8Array(4 << 20));
      // Node's TLS socket hands each record's plaintext on as it is decrypted: a 'data' piece is at most one record.
      const pieces = await new Promise<number[]>((resolve, reject) => {
        https
          .get(`${tls.url}/storage/v1/b/bench/o/o?alt=media`, { ...clientTls(), agent: false }, (res) => {
            const sizes: number[] = [];
            res.on("data", (b: Buffer) => sizes.push(b.length));
            res.on("end", () => resolve(sizes));
            res.on("error", reject);
          })
          .on("error", reject);
      });
      expect(pieces.reduce((a, b) => a + b, 0)).toBe(4 << 20);
      expect(Math.max(...pieces)).toBeGreaterThan(4096);
    } finally {
      tls.stop();
      emulator.stop();
      await emulator.exited;
    }
  });
});
