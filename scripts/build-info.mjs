#!/usr/bin/env node
// Records the source commit a build is made from in build-info.json (beside package.json and dist/, shipped
// with them), which `orbax2reg --version`, `convert --json` and plans report (src/version.ts). The version
// itself stays in package.json alone. Run by `npm run build`, `prepare` and `prepack`, and by the Dockerfile.
//
// Where the commit comes from, first found:
//   ORBAX2REG_COMMIT   a commit id, "-dirty" appended when the tree had changes (the image's build arg: .git
//                      is not in its build context);
//   git                HEAD, and whether tracked files differ from it (untracked files do not count);
//   build-info.json    already there (e.g. written before an image build and sent in its context): kept;
//   otherwise          "unknown".
//
//   node scripts/build-info.mjs            # writes build-info.json if it changes; says what on stderr
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const file = join(root, "build-info.json");

const git = (...args) => spawnSync("git", args, { cwd: root, encoding: "utf8" });

function fromGit() {
  const head = git("rev-parse", "--verify", "HEAD");
  if (head.error || head.status !== 0) return undefined;
  // Refresh the index's stat data first, or a file merely touched (same contents) would count as changed.
  git("update-index", "-q", "--refresh");
  const changed = git("diff-index", "--quiet", "HEAD", "--");
  return { commit: head.stdout.trim(), dirty: changed.status !== 0 };
}

function fromEnv() {
  const given = process.env.ORBAX2REG_COMMIT?.trim();
  if (!given) return undefined;
  const m = /^([0-9a-f]{7,64})(-dirty)?$/.exec(given);
  if (!m) {
    console.error(`build-info: ORBAX2REG_COMMIT=${JSON.stringify(given)} is not a commit id (hex, optionally followed by -dirty)`);
    process.exit(2);
  }
  return { commit: m[1], dirty: m[2] !== undefined };
}

function fromFile() {
  if (!existsSync(file)) return undefined;
  try {
    const info = JSON.parse(readFileSync(file, "utf8"));
    return typeof info.commit === "string" ? { commit: info.commit, dirty: info.dirty ?? null } : undefined;
  } catch {
    return undefined;
  }
}

const info = fromEnv() ?? fromGit() ?? fromFile() ?? { commit: "unknown", dirty: null };
const text = `${JSON.stringify(info)}\n`;
// Unchanged: nothing written (a test run's setup builds while other runs' CLIs may be reading the file).
if (!existsSync(file) || readFileSync(file, "utf8") !== text) {
  writeFileSync(`${file}.tmp-${process.pid}`, text);
  renameSync(`${file}.tmp-${process.pid}`, file);
}
// On stderr: `npm pack --json` runs this (prepack) and its stdout must stay JSON.
process.stderr.write(`build-info.json: ${text}`);
