// The same conversion with both ends in GCS (fake-gcs-server): the objects written are the files a local
// conversion writes, and verify reads them back through GCS.
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { verify } from "../../src/convert/verify.js";
import { runCli } from "../helpers/cli.js";
import { convertWith, digests, fixtureCase, removeScratch, scratch, snapshot, WORK_DIR } from "../helpers/convert.js";
import { emulatorStorage, newBucket, uploadDir } from "../helpers/gcs.js";

afterAll(removeScratch);

/** Every object under gs://bucket/prefix/ (relative keys), the tool's work dir left out. */
async function bucketSnapshot(bucket: string, prefix: string): Promise<Map<string, Buffer>> {
  const [files] = await emulatorStorage()
    .bucket(bucket)
    .getFiles({ prefix: `${prefix}/` });
  const out = new Map<string, Buffer>();
  for (const f of files) {
    const rel = f.name.slice(prefix.length + 1);
    if (rel.startsWith(`${WORK_DIR}/`)) continue;
    const [data] = await f.download();
    out.set(rel, data);
  }
  return new Map([...out].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

async function gcsIndexExists(bucket: string, key: string): Promise<boolean> {
  const [exists] = await emulatorStorage().bucket(bucket).file(key).exists();
  return exists;
}

describe("gs:// source to gs:// destination", () => {
  const multiprocess = fixtureCase("multiprocess");
  const iterators = fixtureCase("iterators");
  let src: string;
  let dst: string;
  const local = scratch("gcs-local");
  let cli: Awaited<ReturnType<typeof runCli>>;

  beforeAll(async () => {
    src = await newBucket("src");
    dst = await newBucket("dst");
    await uploadDir(multiprocess.location, src, "ckpts/step_00000100");
    await uploadDir(iterators.location, src, "it/step_00000100");
    await convertWith(multiprocess.location, join(local, "mp"));
    await convertWith(iterators.location, join(local, "it"));
    cli = await runCli(["convert", `gs://${src}/ckpts/step_00000100`, `gs://${dst}/regular`, "--json"]);
  }, 120_000);

  test("the CLI converts a two-process checkpoint between buckets and commits it", async () => {
    expect(cli.stderr).not.toMatch(/orbax2reg:/);
    expect(cli.code).toBe(0);
    expect(JSON.parse(cli.stdout)).toMatchObject({ step: 100, committed: true, destination: `gs://${dst}/regular/step_00000100` });
    expect(await gcsIndexExists(dst, "regular/step_00000100/index")).toBe(true);
  });

  test("verify passes, reading both the Orbax source and the result from GCS", async () => {
    const r = await verify(`gs://${src}/ckpts/step_00000100`, `gs://${dst}/regular/step_00000100`);
    expect(r.checks.filter((c) => !c.ok)).toEqual([]);
    expect(r.passed).toBeGreaterThan(2);
  });

  test("the destination bucket holds exactly the files of a local conversion, byte for byte", async () => {
    const remote = await bucketSnapshot(dst, "regular/step_00000100");
    const files = snapshot(join(local, "mp/step_00000100"));
    expect([...remote.keys()]).toEqual([...files.keys()]);
    expect(digests(remote)).toEqual(digests(files));
  });

  test("the convert() API converts between buckets too, iterator file included, byte for byte as locally", async () => {
    const r = await convertWith(`gs://${src}/it/step_00000100`, `gs://${dst}/api`);
    expect(r.finalize?.indexWritten).toBe(true);
    const remote = await bucketSnapshot(dst, "api/step_00000100");
    const files = snapshot(join(local, "it/step_00000100"));
    expect(remote.has("python_0/input_iter")).toBe(true);
    expect(digests(remote)).toEqual(digests(files));
    const v = await verify(`gs://${src}/it/step_00000100`, `gs://${dst}/api/step_00000100`);
    expect(v.failed).toBe(0);
  });
});

describe("a step copied to GCS without its commit_success.txt", () => {
  const tiny = fixtureCase("tiny");
  let bucket: string;

  beforeAll(async () => {
    bucket = await newBucket("uncommitted");
    // Orbax on GCS commits a step by writing step_X/commit_success.txt last; hold that one back.
    await uploadDir(tiny.location, bucket, "ckpts/step_00000100", (key) => key === "commit_success.txt");
  });

  test("is refused as uncommitted: exit 2, a message naming the step, and no index written", async () => {
    const r = await runCli(["convert", `gs://${bucket}/ckpts/step_00000100`, `gs://${bucket}/regular`]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(new RegExp(`orbax2reg: gs://${bucket}/ckpts/step_00000100: step is not committed`));
    expect(await gcsIndexExists(bucket, "regular/step_00000100/index")).toBe(false);
    const [written] = await emulatorStorage().bucket(bucket).getFiles({ prefix: "regular/" });
    expect(written.map((f) => f.name)).toEqual([]);
  });

  test("converts with --allow-uncommitted, and verify passes", async () => {
    const r = await runCli(["convert", `gs://${bucket}/ckpts/step_00000100`, `gs://${bucket}/forced`, "--allow-uncommitted"]);
    expect(r.code).toBe(0);
    expect(await gcsIndexExists(bucket, "forced/step_00000100/index")).toBe(true);
    const v = await verify(`gs://${bucket}/ckpts/step_00000100`, `gs://${bucket}/forced/step_00000100`);
    expect(v.failed).toBe(0);
  });
});
