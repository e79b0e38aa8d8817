#!/usr/bin/env node
// `npm run release`: the release's artifacts, from a clean tree at the tag v<version> (package.json's version),
// into release/<version>/:
//   orbax2reg-<version>.tgz                the npm package (README.md, "Install": npm install -g it)
//   orbax2reg-<version>-source.tar.gz      what a deployment is made from: the tagged tree (terraform/, workflows/,
//                                          the sources Google Cloud builds) with build-info.json naming the commit
//   orbax2reg-image-<version>.oci.tar      the image (the CLI and the jobs), as an OCI archive with Docker's
//                                          manifest.json (`docker load` and `podman load` both take it), when a
//                                          container engine can build here (podman, else docker;
//                                          ORBAX2REG_CONTAINER_ENGINE names one) and has or can pull the base
//                                          image; skipped, saying why, otherwise or with --no-image
//   SHA256SUMS                             `sha256sum -c SHA256SUMS` checks them
//
//   npm run release                        # at the tag v<version>, clean tree
//   npm run release -- --snapshot          # any commit of a clean tree: named <version>-<commit>, for testing
//   npm run release -- --no-image
// ORBAX2REG_IMAGE_BASE overrides the Dockerfile's base image (its NODE_IMAGE), as the image test does.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";

const args = process.argv.slice(2);
const snapshot = args.includes("--snapshot");
const withImage = !args.includes("--no-image");
const unknown = args.filter((a) => !["--snapshot", "--no-image"].includes(a));
if (unknown.length > 0) refuse(`unknown argument ${unknown.join(" ")} (takes --snapshot, --no-image)`);

function refuse(why) {
  console.error(`release: ${why}`);
  process.exit(2);
}

/** Git's output, its lines' leading blanks kept (porcelain status lines start with one). */
function git(...a) {
  const r = spawnSync("git", a, { encoding: "utf8" });
  if (r.error || r.status !== 0) refuse(`git ${a.join(" ")} failed: ${(r.stderr || r.error?.message || "").trim()}`);
  return r.stdout.trimEnd();
}

/** Runs a command, its output shown; stops the release when it fails. */
function run(command, a, options = {}) {
  const r = spawnSync(command, a, { stdio: ["ignore", options.capture ? "pipe" : "inherit", "inherit"], encoding: "utf8", ...options });
  if (r.error || r.status !== 0) {
    console.error(`release: ${command} ${a.join(" ")} failed (${r.error?.message ?? `exit ${r.status}`})`);
    process.exit(1);
  }
  return r.stdout ?? "";
}

// What is released must be exactly a commit: every tracked file as committed and nothing untracked (npm pack's
// `files` globs and the image's context would take an untracked file in). Ignored files (dist/, node_modules)
// are rebuilt or not shipped.
const version = JSON.parse(readFileSync("package.json", "utf8")).version;
const commit = git("rev-parse", "HEAD");
const changed = git("status", "--porcelain").split("\n").filter(Boolean);
if (changed.length > 0) {
  const shown = changed.slice(0, 5).map((l) => l.slice(3));
  refuse(
    `the tree is not clean (${shown.join(", ")}${changed.length > 5 ? `, and ${changed.length - 5} more` : ""}): commit or stash first`,
  );
}
const tag = `v${version}`;
if (!snapshot) {
  const tags = git("tag", "--points-at", "HEAD").split("\n").filter(Boolean);
  if (!tags.includes(tag))
    refuse(
      `HEAD (${commit.slice(0, 12)}) is not tagged ${tag} (package.json's version is ${version}; tags at HEAD: ${tags.join(", ") || "none"}): tag it, or pass --snapshot`,
    );
}
const label = snapshot ? `${version}-${commit.slice(0, 12)}` : version;
const out = join("release", label);
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
console.log(`release ${label} from ${commit}${snapshot ? " (snapshot)" : ` (${tag})`} into ${out}/`);

const artifacts = [];

// 1. The npm package: `npm pack` runs prepack and prepare (the build, and build-info.json from this commit).
// Its JSON is the last thing on stdout (the build's scripts may print before it).
const packOutput = run("npm", ["pack", "--json", "--pack-destination", out], { capture: true });
const packed = JSON.parse(packOutput.slice(packOutput.search(/^\[/m)));
const tgz = join(out, `orbax2reg-${label}.tgz`);
if (join(out, packed[0].filename) !== tgz) renameSync(join(out, packed[0].filename), tgz);
artifacts.push(tgz);

// 2. The source archive a deployment is made from (terraform/README.md, "First deployment"): the commit's tracked
// files, which hold terraform/, workflows/ and the sources Google Cloud builds the function and the image from, and
// build-info.json, so that the image terraform has built from it reports this commit (.git is not in the archive).
const prefix = `orbax2reg-${label}`;
const source = join(out, `${prefix}-source.tar.gz`);
const staging = mkdtempSync(join(tmpdir(), "orbax2reg-release-"));
run("git", ["archive", "--format=tar", `--prefix=${prefix}/`, "-o", join(staging, "source.tar"), "HEAD"]);
mkdirSync(join(staging, prefix));
writeFileSync(join(staging, prefix, "build-info.json"), `${JSON.stringify({ commit, dirty: false })}\n`);
run("tar", ["-rf", join(staging, "source.tar"), "-C", staging, "--owner=0", "--group=0", "--mtime=@0", `${prefix}/build-info.json`]);
run("gzip", ["-n", "-9", join(staging, "source.tar")]);
renameSync(join(staging, "source.tar.gz"), source);
rmSync(staging, { recursive: true, force: true });
artifacts.push(source);

// 3. The image, where an engine can build it.
function engine() {
  const candidates = process.env.ORBAX2REG_CONTAINER_ENGINE ? [process.env.ORBAX2REG_CONTAINER_ENGINE] : ["podman", "docker"];
  const tried = [];
  for (const e of candidates) {
    const r = spawnSync(e, ["info"], { encoding: "utf8" });
    if (!r.error && r.status === 0) return { engine: e };
    tried.push(`${e}: ${r.error ? "not installed" : (r.stderr.trim().split("\n").at(-1) ?? `exit ${r.status}`)}`);
  }
  return { why: `no container engine can build here (${tried.join("; ")})` };
}
/**
 * The engine, if it has the base image or can pull it; else why not. The image is made only where it can be
 * built: an engine that cannot reach the base image's registry (a machine offline, or behind a proxy the engine
 * does not use) skips it, saying so, instead of failing the whole release after the package is made.
 */
function withBase(found, base) {
  if (found.engine === undefined) return found;
  if (spawnSync(found.engine, ["image", "inspect", base], { stdio: "ignore" }).status === 0) return found;
  const pull = spawnSync(found.engine, ["pull", base], { encoding: "utf8" });
  if (!pull.error && pull.status === 0) return found;
  const said = pull.error?.message ?? (pull.stderr.trim().split("\n").at(-1) || `exit ${pull.status}`);
  return { why: `${found.engine} cannot pull the base image ${base} (${said})` };
}
const baseImage = process.env.ORBAX2REG_IMAGE_BASE || /^ARG NODE_IMAGE=(\S+)$/m.exec(readFileSync("Dockerfile", "utf8"))?.[1];
const found = withImage ? withBase(engine(), baseImage) : { why: "--no-image" };
if (found.engine === undefined) {
  console.log(`image skipped: ${found.why}`);
} else {
  // Named as `docker load` will name it (podman keeps it as localhost/orbax2reg, which the short name finds).
  const image = `orbax2reg:${label}`;
  const base = process.env.ORBAX2REG_IMAGE_BASE ? ["--build-arg", `NODE_IMAGE=${process.env.ORBAX2REG_IMAGE_BASE}`] : [];
  run(found.engine, ["build", "--network", "host", "--build-arg", `ORBAX2REG_COMMIT=${commit}`, ...base, "-t", image, "."]);
  const tar = join(out, `orbax2reg-image-${label}.oci.tar`);
  // Docker 25+ writes an OCI image layout with `docker save`; podman needs to be told.
  const format = found.engine.endsWith("podman") ? ["--format", "oci-archive"] : [];
  run(found.engine, ["save", ...format, "-o", tar, image]);
  addDockerManifest(tar, image);
  artifacts.push(tar);
}

/**
 * Makes an OCI archive loadable by `docker load` too, as Docker 25+'s own `docker save` writes it: the OCI
 * layout (index.json, blobs/) plus Docker's manifest.json naming the config, the layers and the tag (Docker's
 * loader without the containerd image store reads only manifest.json; podman reads index.json).
 */
function addDockerManifest(tar, tag) {
  const entries = run("tar", ["-tf", tar], { capture: true }).split("\n");
  if (entries.includes("manifest.json")) return;
  const read = (name) => JSON.parse(run("tar", ["-xOf", tar, name], { capture: true }));
  const blob = (digest) => `blobs/${digest.replace(":", "/")}`;
  const [descriptor] = read("index.json").manifests;
  const manifest = read(blob(descriptor.digest));
  const docker = [{ Config: blob(manifest.config.digest), RepoTags: [tag], Layers: manifest.layers.map((l) => blob(l.digest)) }];
  const dir = mkdtempSync(join(tmpdir(), "orbax2reg-release-"));
  writeFileSync(join(dir, "manifest.json"), JSON.stringify(docker));
  run("tar", ["-rf", tar, "-C", dir, "manifest.json"]);
  rmSync(dir, { recursive: true, force: true });
}

// 4. Checksums, as sha256sum writes them.
const sums = artifacts.map((f) => `${createHash("sha256").update(readFileSync(f)).digest("hex")}  ${basename(f)}\n`).join("");
writeFileSync(join(out, "SHA256SUMS"), sums);
artifacts.push(join(out, "SHA256SUMS"));

const mib = (n) => (n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MiB` : `${(n / 1024).toFixed(1)} KiB`);
for (const f of artifacts) console.log(`  ${basename(f).padEnd(44)} ${mib(statSync(f).size).padStart(10)}`);
