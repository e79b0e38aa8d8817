// Ordinary destination problems are one line naming the path and the cause, exit 3, no stack trace, and
// nothing committed: a file where the destination directory goes (ENOTDIR), a directory where `index` goes
// (EISDIR), no permission (EACCES/EPERM), a full disk (ENOSPC), a symbolic link loop (ELOOP), a bucket that does
// not exist (404).
import { spawnSync } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { runCli } from "../helpers/cli.js";
import { fixtureCase, removeScratch, scratch } from "../helpers/convert.js";

afterAll(removeScratch);

const tiny = fixtureCase("tiny");
const STEP = "step_00000100";

/** One line on stderr (no progress lines without --json), the documented exit code, no stack trace. */
function expectOneLine(r: { code: number; stderr: string }, pattern: RegExp): void {
  expect(r.code).toBe(3);
  expect(r.stderr.trim().split("\n")).toHaveLength(1);
  expect(r.stderr).not.toMatch(/unexpected error|\n\s+at /);
  expect(r.stderr).toMatch(pattern);
}

const isRoot = process.getuid?.() === 0;
const sh = (cmd: string, args: string[]) => spawnSync(cmd, args, { encoding: "utf8" }).status === 0;

describe("a local destination that cannot be written", () => {
  test("a file where the destination root should be a directory (ENOTDIR): exit 3, one line naming it", async () => {
    const dir = scratch("enotdir");
    const dest = join(dir, "regular");
    writeFileSync(dest, "not a directory");
    const r = await runCli(["convert", tiny.location, dest]);
    expectOneLine(
      r,
      new RegExp(`orbax2reg: ${dest}/${STEP}/\\S+: (a parent of this path is a file, not a directory|a file is in the way of a directory)`),
    );
  });

  test("a destination root that is a symbolic link to itself (ELOOP): exit 3, one line naming it", async () => {
    const dest = join(scratch("eloop"), "regular");
    symlinkSync(dest, dest);
    const r = await runCli(["convert", tiny.location, dest, "--no-progress"]);
    expectOneLine(r, new RegExp(`orbax2reg: ${dest}/${STEP}: a symbolic link loop \\(too many levels of symbolic links\\)`));
  });

  test("a directory where `index` goes (EISDIR): exit 3, one line naming the index, and nothing committed", async () => {
    const dest = scratch("eisdir");
    mkdirSync(join(dest, STEP, "index", "x"), { recursive: true });
    const r = await runCli(["convert", tiny.location, dest]);
    expectOneLine(r, new RegExp(`orbax2reg: ${dest}/${STEP}/index: is a directory, not a file`));
    expect(existsSync(join(dest, STEP, "index", "x"))).toBe(true);
  });

  test.skipIf(isRoot)("a read-only destination directory (EACCES): exit 3, one line", async () => {
    const dest = scratch("eacces");
    chmodSync(dest, 0o555);
    try {
      const r = await runCli(["convert", tiny.location, dest]);
      expectOneLine(r, /permission denied/);
    } finally {
      chmodSync(dest, 0o755);
    }
  });

  // As root, permissions do not apply; an immutable directory refuses even root (EPERM).
  test.skipIf(!isRoot || !sh("sh", ["-c", "command -v chattr"]))(
    "an immutable destination directory (EPERM, as root): exit 3, one line",
    async () => {
      const dest = scratch("eperm");
      if (!sh("chattr", ["+i", dest])) return;
      try {
        const r = await runCli(["convert", tiny.location, dest]);
        expectOneLine(r, new RegExp(`orbax2reg: ${dest}/${STEP}/\\S+: operation not permitted`));
      } finally {
        sh("chattr", ["-i", dest]);
      }
    },
  );

  test.skipIf(!isRoot)("a full disk (ENOSPC, a 256 KiB tmpfs): exit 3, one line, and no index", async () => {
    const dest = scratch("enospc");
    if (!sh("mount", ["-t", "tmpfs", "-o", "size=256k", "tmpfs", dest])) return; // no mount permission here
    try {
      const r = await runCli(["convert", fixtureCase("large").location, dest]);
      expectOneLine(r, /: no space left on device$/m);
      expect(existsSync(join(dest, "step_00000200", "index"))).toBe(false);
    } finally {
      sh("umount", [dest]);
    }
  });
});

describe("a gs:// destination in a bucket that does not exist", () => {
  test("exit 3, one line naming the destination and the missing bucket", async () => {
    const r = await runCli(["convert", tiny.location, "gs://orbax2reg-no-such-bucket-4d2c/regular"]);
    expectOneLine(r, /^orbax2reg: gs:\/\/orbax2reg-no-such-bucket-4d2c\/regular\S*: no such bucket/m);
  });

  test("plan, too: exit 3, one line", async () => {
    const r = await runCli(["plan", tiny.location, "gs://orbax2reg-no-such-bucket-4d2c/regular"]);
    expectOneLine(r, /^orbax2reg: gs:\/\/orbax2reg-no-such-bucket-4d2c\/regular\S*: no such bucket \(HTTP 404/m);
  });

  // A source bucket that does not exist is bad input instead: test/cli/exit-codes.test.ts.
});
