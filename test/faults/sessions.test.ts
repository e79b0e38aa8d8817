// The instruction proxy (instructions.ts) hands the storage-testbench one request of a resumable upload session
// at a time, as GCS takes them. The testbench runs a session's requests on parallel threads over one unlocked
// Upload: a copy of the last chunk that is still being read when the client, having given up on it, asks what
// was persisted and sends the chunk again is appended a second time, and replaces the object with one too long.
import { connect } from "node:tls";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { newTestbenchBucket, testbenchEndpoint, testbenchMissing, testbenchStorage } from "../helpers/testbench.js";
import { type InstructionProxy, startInstructionProxy } from "./instructions.js";

const missing = testbenchMissing();
const KiB = 1024;
const FIRST = 512 * KiB;
const SIZE = 1024 * KiB;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe.skipIf(missing !== undefined)("upload sessions through the instruction proxy", () => {
  let proxy: InstructionProxy;
  let bucket: string;
  beforeAll(async () => {
    bucket = await newTestbenchBucket("sessions");
    proxy = await startInstructionProxy({ upstream: testbenchEndpoint() as string, seed: 1, rate: 0 });
  });
  afterAll(() => proxy?.close());

  test("a last chunk sent again while its first copy is still arriving is stored once", async () => {
    const opened = await fetch(`${proxy.url}/upload/storage/v1/b/${bucket}/o?uploadType=resumable&name=twice`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    const session = new URL(opened.headers.get("location") as string);
    expect(session.origin).toBe(proxy.url); // its chunks come through the proxy
    const put = (range: string, body?: Uint8Array<ArrayBuffer>) =>
      fetch(session, { method: "PUT", headers: { "content-type": "application/octet-stream", "content-range": range }, body: body ?? "" });
    expect((await put(`bytes 0-${FIRST - 1}/*`, new Uint8Array(FIRST).fill(1))).status).toBe(308);

    // The last chunk's first copy: its head and a few bytes now, the rest later (a testbench slow to read it).
    const last = new Uint8Array(SIZE - FIRST).fill(2);
    const first = connect(Number(session.port), session.hostname); // TLS, as the proxy serves (the workers trust the test CA)
    const firstAnswer = new Promise<string>((resolve) => first.once("data", (d) => resolve(d.toString("latin1").split("\r\n")[0] ?? "")));
    first.write(
      `PUT ${session.pathname}${session.search} HTTP/1.1\r\nhost: ${session.host}\r\ncontent-type: application/octet-stream\r\n` +
        `content-length: ${last.length}\r\ncontent-range: bytes ${FIRST}-${SIZE - 1}/${SIZE}\r\nconnection: close\r\n\r\n`,
    );
    first.write(last.subarray(0, 1000));
    await sleep(200);

    // The client gives that copy up: asks what was persisted, and sends the rest again if the answer says so.
    const status = put(`bytes */${SIZE}`);
    await sleep(300);
    first.write(last.subarray(1000));
    const persisted = await status;
    if (persisted.status === 308) {
      expect(persisted.headers.get("range")).toBe(`bytes=0-${FIRST - 1}`);
      expect((await put(`bytes ${FIRST}-${SIZE - 1}/${SIZE}`, last)).status).toBe(200);
    } else {
      expect(persisted.status).toBe(200);
    }
    const answer = await firstAnswer;
    first.destroy();

    const [metadata] = await testbenchStorage().bucket(bucket).file("twice").getMetadata();
    expect(Number(metadata.size)).toBe(SIZE);
    expect(answer).toMatch(/^HTTP\/1\.1 200/); // the first copy completed the object; the rest found it complete
  });
});

// Where it is missing, one skipped test says why (npm test lists it); where it is there, nothing.
if (missing !== undefined) test.skip(missing, () => {});
