import { spawnSync } from "node:child_process";
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { PLAN_KEY } from "../../src/convert/work-dir.js";
import { buildIdentity, versionLine } from "../../src/version.js";
import { runBin, runCli } from "../helpers/cli.js";
import { FIXTURES } from "../helpers/paths.js";
import { tempDir } from "../helpers/tmp.js";

// Which orbax2reg made a result: the version from package.json, the commit from build-info.json, which
// scripts/build-info.mjs writes at build and pack time (an installed package has no .git to ask).

const TINY = `${FIXTURES}/orbax-axlearn/tiny/step_00000100`;
const pkg = JSON.parse(readFileSync("package.json", "utf8")) as { version: string };
const git = (cwd: string, ...args: string[]) => {
  const r = spawnSync("git", ["-c", "user.name=t", "-c", "user.email=t@example.com", ...args], { cwd, encoding: "utf8" });
  expect(r.status, r.stderr).toBe(0);
  return r.stdout.trim();
};

/** A copy of the script and package.json in a folder of its own, so it records that folder's state. */
function project(): string {
  const dir = tempDir("build-info");
  mkdirSync(join(dir, "scripts"));
  copyFileSync("scripts/build-info.mjs", join(dir, "scripts/build-info.mjs"));
  copyFileSync("package.json", join(dir, "package.json"));
  return dir;
}
const buildInfo = (dir: string, env: NodeJS.ProcessEnv = {}) => {
  const r = spawnSync(process.execPath, ["scripts/build-info.mjs"], { cwd: dir, encoding: "utf8", env: { ...process.env, ...env } });
  return {
    code: r.status,
    stderr: r.stderr,
    info: r.status === 0 ? JSON.parse(readFileSync(join(dir, "build-info.json"), "utf8")) : undefined,
  };
};

describe("build-info.json", () => {
  test("records HEAD, clean when no tracked file differs from it (untracked files do not count)", () => {
    const dir = project();
    git(dir, "init", "-q");
    git(dir, "add", "package.json", "scripts");
    git(dir, "commit", "-q", "-m", "x");
    writeFileSync(join(dir, "untracked.txt"), "");
    expect(buildInfo(dir).info).toEqual({ commit: git(dir, "rev-parse", "HEAD"), dirty: false });
  });

  test("records dirty when a tracked file differs from HEAD", () => {
    const dir = project();
    git(dir, "init", "-q");
    git(dir, "add", "package.json", "scripts");
    git(dir, "commit", "-q", "-m", "x");
    writeFileSync(join(dir, "package.json"), "{}\n");
    expect(buildInfo(dir).info).toMatchObject({ dirty: true });
  });

  test("without git: ORBAX2REG_COMMIT (the image's build arg), else the file already there, else unknown", () => {
    const dir = project();
    expect(buildInfo(dir, { GIT_DIR: join(dir, "no-git") }).info).toEqual({ commit: "unknown", dirty: null });
    const commit = "0123abcd4567".repeat(3).slice(0, 40);
    expect(buildInfo(dir, { ORBAX2REG_COMMIT: commit }).info).toEqual({ commit, dirty: false });
    expect(buildInfo(dir, { GIT_DIR: join(dir, "no-git") }).info).toEqual({ commit, dirty: false });
    expect(buildInfo(dir, { ORBAX2REG_COMMIT: `${commit}-dirty` }).info).toEqual({ commit, dirty: true });
  });

  test("refuses an ORBAX2REG_COMMIT that is not a commit id, naming it", () => {
    const r = buildInfo(project(), { ORBAX2REG_COMMIT: "main" });
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/ORBAX2REG_COMMIT="main" is not a commit id/);
  });
});

describe("orbax2reg --version", () => {
  beforeAll(() => {
    expect(spawnSync(process.execPath, ["scripts/build-info.mjs"]).status).toBe(0);
  });

  test("prints the package's version and the commit it was built from", () => {
    const r = runBin(["--version"]);
    expect(r.code).toBe(0);
    expect(r.stderr).toBe("");
    const { commit } = JSON.parse(readFileSync("build-info.json", "utf8"));
    expect(r.stdout).toMatch(
      new RegExp(`^orbax2reg ${pkg.version.replaceAll(".", "\\.")} \\(commit ${commit.slice(0, 12)}, (clean|dirty)\\)\n$`),
    );
  });

  test("says unknown when built without git", () => {
    expect(versionLine({ version: "0.2.0", commit: "unknown", dirty: null })).toBe("orbax2reg 0.2.0 (commit unknown)");
    expect(versionLine({ version: "0.2.0", commit: "0123abcd4567ffff", dirty: false })).toBe(
      "orbax2reg 0.2.0 (commit 0123abcd4567, clean)",
    );
  });
});

describe("what a conversion records", () => {
  test("convert --json names the orbax2reg that made it", async () => {
    const r = await runCli(["convert", TINY, tempDir("dest"), "--json"]);
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout).orbax2reg).toEqual({ version: pkg.version, commit: buildIdentity().commit, dirty: buildIdentity().dirty });
  });

  test("the plan record says which orbax2reg wrote it", async () => {
    const dest = tempDir("dest");
    expect((await runCli(["plan", TINY, dest])).code).toBe(0);
    const head = JSON.parse(readFileSync(join(dest, "step_00000100", PLAN_KEY), "utf8"));
    expect(head.writtenBy).toEqual(buildIdentity());
    expect(head.version).toBe(5);
  });
});
