// Every object's CRC-32C is recorded when it is written (a local-to-local verbatim copy records none: its
// source is what it is compared with); resume and finalize compare the stored bytes with it, so a
// destination object with a flipped byte (same size) is found and rewritten without --force.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { verify } from "../../src/convert/verify.js";
import { runCli } from "../helpers/cli.js";
import {
  convertWith,
  digests,
  fixtureCase,
  planOnDisk,
  recordedOnDisk,
  removeScratch,
  scratch,
  snapshot,
  WORK_DIR,
} from "../helpers/convert.js";
import { emulatorStorage, newBucket, uploadDir } from "../helpers/gcs.js";

afterAll(removeScratch);

const large = fixtureCase("large");
const STEP = "step_00000200";
const CHUNK = "gda/model/decoder/emb/token_emb/weight/0.0";
const clean = scratch("crc-clean");

/** Flips one bit in the middle of a file, keeping its size. */
function flipByte(path: string): void {
  const bytes = readFileSync(path);
  bytes[bytes.length >> 1] = (bytes[bytes.length >> 1] as number) ^ 0x01;
  writeFileSync(path, bytes);
}

beforeAll(async () => {
  await convertWith(large.location, clean);
}, 60_000);

describe("an unfinished step with a flipped byte in a written chunk", () => {
  const dest = scratch("crc-unfinished");
  const stepDir = join(dest, STEP);

  beforeAll(async () => {
    expect((await runCli(["plan", large.location, dest])).code).toBe(0);
    expect((await runCli(["convert-group", dest, "--step", "200", "--group", "0"])).code).toBe(0);
    flipByte(join(stepDir, CHUNK));
  }, 60_000);

  test("the writer recorded every object under the plan's id: size, and CRC-32C unless a local verbatim copy", () => {
    const plan = planOnDisk(stepDir);
    const recorded = recordedOnDisk(stepDir, plan.id);
    expect(recorded).toHaveLength(plan.objects.length);
    const copied = new Set(
      plan.objects
        .filter((o: { transform: string; data: { kind: string } }) => o.transform === "copy" && o.data.kind === "range")
        .map((o: { target: string }) => o.target),
    );
    for (const [target, size, crc] of recorded) {
      expect(Number.isInteger(size)).toBe(true);
      if (crc === null) expect(copied.has(target)).toBe(true);
      else expect(crc >>> 0).toBe(crc);
    }
    expect(recorded.some(([, , crc]) => crc === null)).toBe(true);
  });

  test("finalize refuses it (exit 2, naming the CRC-32C) and commits nothing", async () => {
    const r = await runCli(["finalize", dest, "--step", "200"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(
      /1 planned object\(s\).*different from the CRC-32C of the bytes written; first: gda\/model\/decoder\/emb\/token_emb\/weight\/0\.0/,
    );
  });

  test("convert-group again rewrites exactly that chunk, and finalize commits the clean bytes", async () => {
    const r = await runCli(["convert-group", dest, "--step", "200", "--group", "0", "--json"]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout).written).toBe(1);
    expect((await runCli(["finalize", dest, "--step", "200"])).code).toBe(0);
    expect(digests(snapshot(stepDir))).toEqual(digests(snapshot(join(clean, STEP))));
  });
});

describe("a committed step with a flipped byte, converted again from the same source", () => {
  const dest = scratch("crc-committed");
  const stepDir = join(dest, STEP);
  let repaired: Record<string, unknown>;

  beforeAll(async () => {
    await convertWith(large.location, dest);
    flipByte(join(stepDir, CHUNK));
    const r = await runCli(["convert", large.location, dest, "--json"]);
    expect(r.code).toBe(0);
    repaired = JSON.parse(r.stdout);
  }, 60_000);

  test("rewrites only the damaged chunk (no --force needed) and keeps the step committed", () => {
    expect(repaired).toMatchObject({ resumed: true, alreadyConverted: false, committed: true, written: 1 });
  });

  test("the result equals a clean conversion and verify passes", async () => {
    expect(digests(snapshot(stepDir))).toEqual(digests(snapshot(join(clean, STEP))));
    expect((await verify(large.location, stepDir)).failed).toBe(0);
  });
});

describe("objects without a record (their writer died before recording them)", () => {
  test("are kept when their bytes match the source, and rewritten when they do not", async () => {
    const dest = scratch("crc-unrecorded");
    const stepDir = join(dest, STEP);
    expect((await runCli(["plan", large.location, dest])).code).toBe(0);
    expect((await runCli(["convert-group", dest, "--step", "200", "--group", "0"])).code).toBe(0);
    const { rmSync } = await import("node:fs");
    rmSync(join(stepDir, WORK_DIR, "records"), { recursive: true });
    flipByte(join(stepDir, CHUNK));
    const r = await runCli(["convert-group", dest, "--step", "200", "--group", "0", "--json"]);
    expect(JSON.parse(r.stdout)).toMatchObject({ written: 1 });
    expect((await runCli(["finalize", dest, "--step", "200"])).code).toBe(0);
    expect(digests(snapshot(stepDir))).toEqual(digests(snapshot(join(clean, STEP))));
  });
});

describe("on GCS, the stored CRC-32C is compared with the recorded one", () => {
  test("an object replaced with a flipped byte is rewritten by the re-run, and the result verifies", async () => {
    const bucket = await newBucket("crc");
    await uploadDir(large.location, bucket, `ckpt/${STEP}`);
    const src = `gs://${bucket}/ckpt/${STEP}`;
    const dst = `gs://${bucket}/regular`;
    expect((await runCli(["convert", src, dst])).code).toBe(0);
    const file = emulatorStorage().bucket(bucket).file(`regular/${STEP}/${CHUNK}`);
    const [bytes] = await file.download();
    bytes[bytes.length >> 1] = (bytes[bytes.length >> 1] as number) ^ 0x01;
    await file.save(bytes, { resumable: false });
    const r = await runCli(["convert", src, dst, "--json"]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ written: 1, committed: true });
    const again = await runCli(["convert", src, dst, "--json"]);
    expect(JSON.parse(again.stdout)).toMatchObject({ written: 0, alreadyConverted: true, resumed: true });
    expect((await verify(src, `${dst}/${STEP}`)).failed).toBe(0);
  }, 60_000);
});
