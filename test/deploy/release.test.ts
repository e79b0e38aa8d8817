import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { run } from "../helpers/run.js";
import { tempDir } from "../helpers/tmp.js";

// `npm run release` (scripts/release.mjs) in a repository of its own: the tracked files of this tree as they are
// now, committed once, with this tree's node_modules linked in. The image is left out (--no-image):
// test/deploy/image.test.ts builds and runs it, and building it again here would take minutes.

const version = (JSON.parse(readFileSync("package.json", "utf8")) as { version: string }).version;
let repo: string;

const git = (...args: string[]) => {
  const r = spawnSync("git", ["-c", "user.name=t", "-c", "user.email=t@example.com", ...args], { cwd: repo, encoding: "utf8" });
  expect(r.status, r.stderr).toBe(0);
  return r.stdout.trim();
};
// Asynchronous: a release builds and packs for tens of seconds (test/helpers/run.ts says why that matters).
const release = (...args: string[]) => run(process.execPath, ["scripts/release.mjs", "--no-image", ...args], { cwd: repo });
const sha256 = (file: string) => createHash("sha256").update(readFileSync(file)).digest("hex");
/** A file of the npm tarball, by its path inside the package. */
const fromTarball = (tgz: string, path: string) => spawnSync("tar", ["-xzOf", tgz, `package/${path}`], { encoding: "utf8" });

beforeAll(() => {
  repo = tempDir("release");
  const tracked = spawnSync("git", ["ls-files", "-z"], { encoding: "utf8" }).stdout.split("\0").filter(Boolean);
  for (const f of tracked.filter((f) => existsSync(f))) {
    mkdirSync(join(repo, dirname(f)), { recursive: true });
    cpSync(f, join(repo, f));
  }
  symlinkSync(realpathSync("node_modules"), join(repo, "node_modules"));
  git("init", "-q");
  git("add", "-A");
  git("commit", "-q", "-m", "release test");
}, 60_000);

describe("npm run release", () => {
  test("refuses a commit not tagged v<version>, naming the tag and --snapshot", async () => {
    const r = await release();
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(new RegExp(`is not tagged v${version.replaceAll(".", "\\.")} .*tags at HEAD: none.*--snapshot`));
    expect(existsSync(join(repo, "release"))).toBe(false);
  });

  test("refuses a tree with changes, naming the files, even with --snapshot", async () => {
    writeFileSync(join(repo, "README.md"), "changed\n");
    writeFileSync(join(repo, "untracked.md"), "new\n");
    const r = await release("--snapshot");
    git("checkout", "README.md");
    rmSync(join(repo, "untracked.md"));
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/the tree is not clean \(README\.md, untracked\.md\)/);
  });

  test("at the tag: the npm package and the source archive named by the version, and SHA256SUMS that checks them", async () => {
    git("tag", `v${version}`);
    const commit = git("rev-parse", "HEAD");
    const r = await release();
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/image skipped: --no-image/);
    const out = join(repo, "release", version);
    const names = [`orbax2reg-${version}.tgz`, `orbax2reg-${version}-source.tar.gz`];
    expect(readdirSync(out).sort()).toEqual(["SHA256SUMS", ...names].sort());
    expect(readFileSync(join(out, "SHA256SUMS"), "utf8")).toBe(names.map((n) => `${sha256(join(out, n))}  ${n}\n`).join(""));
    expect(spawnSync("sha256sum", ["-c", "SHA256SUMS"], { cwd: out }).status).toBe(0);

    // The package says which commit it is, and that it is that commit as committed.
    const tgz = join(out, names[0] as string);
    expect(JSON.parse(fromTarball(tgz, "package.json").stdout).version).toBe(version);
    expect(JSON.parse(fromTarball(tgz, "build-info.json").stdout)).toEqual({ commit, dirty: false });
    // The source archive is the tagged tree, with the commit for the image terraform builds from it.
    const listing = spawnSync("tar", ["-tzf", join(out, names[1] as string)], { encoding: "utf8" }).stdout.split("\n");
    const prefix = `orbax2reg-${version}`;
    expect(listing).toEqual(
      expect.arrayContaining([`${prefix}/terraform/examples/basic/main.tf`, `${prefix}/workflows/convert.yaml`, `${prefix}/Dockerfile`]),
    );
    const info = spawnSync("tar", ["-xzOf", join(out, names[1] as string), `${prefix}/build-info.json`], { encoding: "utf8" }).stdout;
    expect(JSON.parse(info)).toEqual({ commit, dirty: false });
  }, 180_000);

  test("the npm package holds every file its README links to", () => {
    const tgz = join(repo, "release", version, `orbax2reg-${version}.tgz`);
    const listed = new Set(spawnSync("tar", ["-tzf", tgz], { encoding: "utf8" }).stdout.split("\n"));
    const readme = fromTarball(tgz, "README.md").stdout;
    const links = [...readme.matchAll(/\]\(([^)#\s]+)(?:#[^)]*)?\)/g)].map((m) => m[1] as string).filter((l) => !/^[a-z]+:/.test(l));
    expect(links.length).toBeGreaterThan(5);
    expect(links.filter((l) => !listed.has(`package/${l}`))).toEqual([]);
  });

  test("an engine that cannot pull the base image: the image is skipped with the reason, the rest released", async () => {
    // A stand-in engine: it runs, has no base image and cannot reach the registry, as podman offline.
    const engine = join(tempDir("engine"), "podman");
    writeFileSync(
      engine,
      '#!/bin/sh\ncase "$1" in\n  info) exit 0 ;;\n  pull) echo "Error: initializing source $2: pinging container registry: connection refused" >&2; exit 125 ;;\n  *) exit 1 ;;\nesac\n',
      { mode: 0o755 },
    );
    const commit = git("rev-parse", "HEAD");
    const r = await run(process.execPath, ["scripts/release.mjs", "--snapshot"], {
      cwd: repo,
      env: { ...process.env, ORBAX2REG_CONTAINER_ENGINE: engine, ORBAX2REG_IMAGE_BASE: "node:22-bookworm-slim" },
    });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain(
      `image skipped: ${engine} cannot pull the base image node:22-bookworm-slim (Error: initializing source node:22-bookworm-slim: pinging container registry: connection refused)`,
    );
    const label = `${version}-${commit.slice(0, 12)}`;
    expect(readdirSync(join(repo, "release", label)).sort()).toEqual(
      ["SHA256SUMS", `orbax2reg-${label}.tgz`, `orbax2reg-${label}-source.tar.gz`].sort(),
    );
    rmSync(join(repo, "release", label), { recursive: true });
  }, 180_000);

  test("--snapshot names the artifacts by the commit", async () => {
    const commit = git("rev-parse", "HEAD");
    git("tag", "-d", `v${version}`);
    const r = await release("--snapshot");
    expect(r.code, r.stderr).toBe(0);
    const label = `${version}-${commit.slice(0, 12)}`;
    expect(readdirSync(join(repo, "release", label)).sort()).toEqual(
      ["SHA256SUMS", `orbax2reg-${label}.tgz`, `orbax2reg-${label}-source.tar.gz`].sort(),
    );
  }, 180_000);
});
