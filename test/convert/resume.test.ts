// A conversion killed half-way leaves an uncommitted step (no index); running it again finishes it with
// exactly the bytes of an uninterrupted conversion. A committed destination is never overwritten by accident.
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdirSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { verify } from "../../src/convert/verify.js";
import { runCli } from "../helpers/cli.js";
import { convertWith, digests, fixtureCase, planOnDisk, removeScratch, scratch, snapshot, WORK_DIR } from "../helpers/convert.js";
import { filesBelow } from "../helpers/paths.js";

afterAll(removeScratch);

const large = fixtureCase("large");
const STEP = "step_00000200";
const clean = scratch("clean");

const TMP = /\.tmp-[0-9a-f]+$/;

/** Files under gda/: finished objects, and the temporary files of writes in flight. */
function filesUnder(stepDir: string): { objects: string[]; temporary: string[] } {
  const all = filesBelow(join(stepDir, "gda"));
  return { objects: all.filter((p) => !TMP.test(p)), temporary: all.filter((p) => TMP.test(p)) };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Killed {
  signal: NodeJS.Signals | null;
  code: number | null;
  objects: number;
  temporary: number;
}

/**
 * Runs the real executable and SIGKILLs it mid-way: once some objects exist and, if possible, while a write
 * is in flight. The child runs in short slices (SIGCONT, a few ms, SIGSTOP, look), so the kill lands mid-way
 * although the whole copy takes ~0.1 s.
 */
async function killMidway(args: string[], stepDir: string): Promise<Killed> {
  const child: ChildProcess = spawn(process.execPath, ["bin/orbax2reg.js", ...args], { stdio: "ignore" });
  let ended: { signal: NodeJS.Signals | null; code: number | null } | undefined;
  const exit = new Promise<{ signal: NodeJS.Signals | null; code: number | null }>((resolve) =>
    child.on("exit", (code, signal) => {
      ended = { code, signal };
      resolve(ended);
    }),
  );
  while (ended === undefined) {
    await sleep(2);
    if (ended !== undefined) break;
    child.kill("SIGSTOP");
    const now = filesUnder(stepDir);
    if ((now.objects.length > 0 && now.temporary.length > 0) || now.objects.length >= 8) {
      child.kill("SIGKILL");
      break;
    }
    child.kill("SIGCONT");
  }
  const e = await exit;
  const after = filesUnder(stepDir);
  return { ...e, objects: after.objects.length, temporary: after.temporary.length };
}

/** Snapshot filter: the tool's work dir and a killed writer's temporary files left out. */
const finished = (rel: string) => !rel.startsWith(`${WORK_DIR}/`) && !TMP.test(rel);

beforeAll(async () => {
  await convertWith(large.location, clean);
}, 60_000);

describe("convert-group killed with SIGKILL mid-way, then run again", () => {
  const dest = scratch("killed");
  const stepDir = join(dest, STEP);
  let killed: Killed;
  let planned: number;

  beforeAll(async () => {
    expect((await runCli(["plan", large.location, dest])).code).toBe(0);
    planned = planOnDisk(stepDir).objects.length;
    killed = await killMidway(["convert-group", dest, "--step", "200", "--group", "0", "--concurrency", "1"], stepDir);
  }, 60_000);

  test("the process died from the kill with some, not all, objects written", () => {
    expect(killed.signal).toBe("SIGKILL");
    expect(killed.objects).toBeGreaterThan(0);
    expect(killed.objects).toBeLessThan(planned);
  });

  test("no index exists after the kill (the step is not committed)", () => {
    expect(existsSync(join(stepDir, "index"))).toBe(false);
  });

  test("finalize refuses the incomplete step and still writes no index", async () => {
    const r = await runCli(["finalize", dest, "--step", "200"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/planned object\(s\) missing/);
    expect(existsSync(join(stepDir, "index"))).toBe(false);
  });

  test("convert-group again skips what exists and finishes the group", async () => {
    const r = await runCli(["convert-group", dest, "--step", "200", "--group", "0", "--json"]);
    expect(r.code).toBe(0);
    const report = JSON.parse(r.stdout);
    expect(report.skipped).toBe(killed.objects);
    expect(report.written).toBe(planned - killed.objects);
  });

  test("finalize then commits a result byte-identical to an uninterrupted conversion (temporary files aside)", async () => {
    expect((await runCli(["finalize", dest, "--step", "200"])).code).toBe(0);
    const got = snapshot(stepDir, finished);
    const want = snapshot(join(clean, STEP));
    expect([...got.keys()]).toEqual([...want.keys()]);
    expect(digests(got)).toEqual(digests(want));
  });

  test("verify passes on the resumed result", async () => {
    const r = await verify(large.location, stepDir);
    expect(r.checks.filter((c) => !c.ok)).toEqual([]);
  });
});

describe("convert killed mid-way, then convert again", () => {
  const dest = scratch("killed-convert");
  const stepDir = join(dest, STEP);
  let killed: Killed;
  let committedAfterKill: boolean;
  let rerun: Awaited<ReturnType<typeof runCli>>;

  beforeAll(async () => {
    killed = await killMidway(["convert", large.location, dest, "--concurrency", "1"], stepDir);
    committedAfterKill = existsSync(join(stepDir, "index"));
    rerun = await runCli(["convert", large.location, dest, "--json"]);
  }, 60_000);

  test("the first run was killed before committing: no index", () => {
    expect(killed.signal).toBe("SIGKILL");
    expect(killed.objects).toBeGreaterThan(0);
    expect(committedAfterKill).toBe(false);
  });

  test("the second run reuses the plan, skips the objects already written and commits", () => {
    expect(rerun.code).toBe(0);
    const summary = JSON.parse(rerun.stdout);
    expect(summary).toMatchObject({ resumed: true, committed: true });
    expect(summary.skipped).toBeGreaterThan(0);
  });

  test("the result is byte-identical to an uninterrupted conversion (temporary files aside)", () => {
    expect(digests(snapshot(stepDir, finished))).toEqual(digests(snapshot(join(clean, STEP))));
  });
});

// src/store/local.ts:150 write() streams into `<key>.tmp-<random>` and renames; a SIGKILL in between leaves
// that file behind (the kills above usually do: killMidway prefers a moment with a write in flight), and
// nothing (neither convert-group on resume nor finalize) ever removes it. The committed step then keeps stray
// files next to the chunks, up to a whole chunk each (hundreds of MB for fuji-sized chunks).
test("a temporary file a killed writer left behind is gone once the re-run commits", async () => {
  const dest = scratch("stale-tmp");
  const stepDir = join(dest, STEP);
  expect((await runCli(["plan", large.location, dest])).code).toBe(0);
  const stale = join(stepDir, "gda/model/decoder/output/weight/0.0.tmp-0123456789ab");
  mkdirSync(join(stepDir, "gda/model/decoder/output/weight"), { recursive: true });
  writeFileSync(stale, Buffer.alloc(4096, 7)); // what LocalStore.write leaves when killed mid-write
  expect((await runCli(["convert", large.location, dest])).code).toBe(0);
  expect(existsSync(stale)).toBe(false);
});

describe("converting again into a committed destination", () => {
  const dest = scratch("committed");
  const stepDir = join(dest, STEP);

  beforeAll(async () => {
    await convertWith(large.location, dest);
  }, 60_000);

  // Changed by the issue (#5): converting the same source again used to exit 2 ("already committed").
  test("from the same source is a success that writes nothing: exit 0, already converted, checkpoint unchanged", async () => {
    const before = digests(snapshot(stepDir, (rel) => !rel.startsWith(`${WORK_DIR}/`)));
    const r = await runCli(["convert", large.location, dest, "--json"]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ resumed: true, alreadyConverted: true, committed: true, written: 0 });
    expect(digests(snapshot(stepDir, (rel) => !rel.startsWith(`${WORK_DIR}/`)))).toEqual(before);
    const text = await runCli(["convert", large.location, dest]);
    expect(text.stdout).toMatch(/^already converted: /);
  });

  test("with other options (another conversion) is refused without --force: exit 2, and the checkpoint is left as it was", async () => {
    const before = digests(snapshot(stepDir, () => true));
    const r = await runCli(["convert", large.location, dest, "--params-only"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/already committed.*--force/);
    expect(r.stderr).toContain(join(stepDir, "index"));
    expect(digests(snapshot(stepDir, () => true))).toEqual(before);
  });

  test("--force redoes it: a damaged chunk is rewritten and the result equals a clean conversion", async () => {
    const chunk = join(stepDir, "gda/model/decoder/emb/token_emb/weight/0.0");
    writeFileSync(chunk, Buffer.alloc(statSync(chunk).size, 0)); // same size: only a real rewrite repairs it
    const r = await runCli(["convert", large.location, dest, "--force", "--json"]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ resumed: false, committed: true, skipped: 0 });
    expect(digests(snapshot(stepDir))).toEqual(digests(snapshot(join(clean, STEP))));
  });
});
