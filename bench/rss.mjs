#!/usr/bin/env node
// Peak RSS of `orbax2reg convert` on the GCS path (see bench/README.md, "rss.mjs"): the step holding one 1 GiB
// chunk (bench/gen_big.py) local -> local, gs:// -> local, local -> gs://, gs:// -> gs://, and the 2 GB
// fuji-shaped step (bench/gen_fuji.py) gs:// -> gs:// at several --concurrency and --memory settings, on
// fake-gcs-server with its filesystem backend, over HTTPS as GCS serves (--plain: over plain HTTP instead, to
// compare), and `verify` of both steps' outputs, local against local and gs:// against gs://. Peak RSS is GNU
// time's maximum resident set size (bench/lib.mjs's timed()). --cli times another build's launcher (an earlier
// commit's tree, built) on the same sources and emulator, for before-and-after figures.
//
//   node bench/rss.mjs [--only big|fuji] [--chunk-mib N] [--plain] [--cli path/to/bin/orbax2reg.js]
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, rmSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { createBucket, runTrustingTestCa, startEmulator } from "./fake-gcs.mjs";
import { flag, flags, ROOT, requireBuilt, requireFiles, timed } from "./lib.mjs";

const opts = flags(process.argv.slice(2), {
  "--only": flag.choice(undefined, ["big", "fuji"]),
  "--chunk-mib": flag.count(undefined),
  "--plain": flag.on(),
  "--cli": flag.text(undefined, "path/to/bin/orbax2reg.js"),
});
const { only, plain } = opts;
const chunkMib = opts.chunkMib === undefined ? undefined : String(opts.chunkMib);
const cli = opts.cli ?? join(ROOT, "bin/orbax2reg.js");
// The uploads go through this checkout's dist/ whichever --cli is timed.
requireBuilt();
// The emulator serves HTTPS with the tests' CA: this process (its uploads) and the CLI it runs trust it.
await runTrustingTestCa();
process.chdir(ROOT);
requireFiles([[cli, "--cli names a build's bin/orbax2reg.js"]]);
const GEN = join(ROOT, "bench/.generated");

const fsRoot = join(GEN, "rss-gcs");
// Stopped, and its folder removed, on exit, SIGINT and SIGTERM (bench/fake-gcs.mjs).
const emulator = await startEmulator(fsRoot, { plain });
const { stop } = emulator;
const endpoint = plain ? emulator.plainUrl : emulator.url;
console.log(`fake-gcs-server over ${plain ? "plain HTTP" : "HTTPS"}: ${endpoint}`);

/**
 * Uploads a step directory to gs://src/<prefix> with the converter's own store, in chunks of 256 MiB: the
 * emulator rehashes a whole upload on every chunk, so 8 MiB chunks of a 1 GiB object take it minutes.
 */
async function upload(dir, prefix) {
  process.env.ORBAX2REG_GCS_ENDPOINT = endpoint;
  const { GcsStore } = await import(join(ROOT, "dist/src/store/gcs.js"));
  const { LocalStore } = await import(join(ROOT, "dist/src/store/local.js"));
  const dest = new GcsStore("src", prefix, undefined, undefined, { chunkBytes: 256 << 20 });
  const src = new LocalStore(dir);
  for (const f of readdirSync(dir, { recursive: true, withFileTypes: true }).filter((e) => e.isFile())) {
    const key = relative(dir, join(f.parentPath, f.name));
    await dest.write(key, src.readStream(key, 0, statSync(join(dir, key)).size));
  }
}

const env = {
  ORBAX2REG_GCS_ENDPOINT: endpoint,
  ORBAX2REG_GCS_STALL_MS: "600000",
  ...(chunkMib ? { ORBAX2REG_GCS_CHUNK_MIB: chunkMib } : {}),
};
let n = 0;
/** Converts; a local destination is removed afterwards unless `keep` (then the caller removes it). */
async function convert(source, dest, extra = [], keep = false) {
  const out = dest === "local" ? join(GEN, `rss-out-${n++}`) : `gs://dst/run-${n++}`;
  const r = await timed(cli, ["convert", source, out, "--json", ...extra], env);
  if (dest === "local" && !keep) rmSync(out, { recursive: true, force: true });
  if (r.status !== 0) throw new Error(`convert ${source} -> ${out} failed: ${r.stderr.slice(-500)}`);
  return { ...figures(r), out };
}
const figures = (r) => ({ mib: Math.round(r.rssKiB / 1024), wall: r.seconds.toFixed(2), cpu: Math.round(r.cpu * 10) / 10 });

/** `orbax2reg verify` of a converted step against its source; fails unless every check passed. */
async function verify(source, regular) {
  const r = await timed(cli, ["verify", source, regular], env);
  const summary = r.stdout.trim().split("\n").at(-1);
  if (r.status !== 0 || !/ 0 failed$/.test(summary)) throw new Error(`verify ${regular} failed: ${summary} ${r.stderr.slice(-500)}`);
  return { ...figures(r), summary };
}

execFileSync("npx", ["tsc", "-p", "tsconfig.build.json"], { cwd: ROOT, stdio: "inherit" });
await createBucket(endpoint, "src");
await createBucket(endpoint, "dst");
const rows = [];
const row = (what, r) => {
  rows.push(`| ${what} | ${r.mib} MiB | ${r.wall} s | ${r.cpu} s |`);
  console.log(rows.at(-1));
};

if (only !== "fuji") {
  execFileSync(join(ROOT, ".venv/bin/python"), [join(ROOT, "bench/gen_big.py")], { stdio: "inherit" });
  const step = join(GEN, "big-chunk/ckpt/step_00000001");
  await upload(step, "big/step_00000001");
  const local = await convert(step, "local", [], true);
  row("local → local, 1 GiB chunk", local);
  const checkedLocal = await verify(step, `${local.out}/step_00000001`);
  rmSync(local.out, { recursive: true, force: true });
  row(`verify local against local, 1 GiB chunk (${checkedLocal.summary})`, checkedLocal);
  row("gs:// → local, 1 GiB chunk", await convert("gs://src/big/step_00000001", "local"));
  row("local → gs://, 1 GiB chunk", await convert(step, "gs"));
  const copied = await convert("gs://src/big/step_00000001", "gs");
  row("gs:// → gs://, 1 GiB chunk", copied);
  const checked = await verify("gs://src/big/step_00000001", `${copied.out}/step_00000001`);
  row(`verify gs:// against gs://, 1 GiB chunk (${checked.summary})`, checked);
}
if (only !== "big") {
  execFileSync(join(ROOT, ".venv/bin/python"), [join(ROOT, "bench/gen_fuji.py")], { stdio: "inherit" });
  const step = join(GEN, "fuji-mini/ckpt/step_00001000");
  if (!existsSync(step)) throw new Error(`${step} is missing`);
  await upload(step, "fuji/step_00001000");
  const local = await convert(step, "local", [], true);
  row("local → local, 2 GB step", local);
  const checkedLocal = await verify(step, `${local.out}/step_00001000`);
  rmSync(local.out, { recursive: true, force: true });
  row(`verify local against local, 2 GB step (${checkedLocal.summary})`, checkedLocal);
  let copied;
  for (const c of [1, 8, 16, 32]) {
    const r = await convert("gs://src/fuji/step_00001000", "gs", ["--concurrency", String(c)]);
    if (c === 16) copied = r;
    row(`gs:// → gs://, 2 GB step, --concurrency ${c}`, r);
  }
  row("gs:// → gs://, 2 GB step, --memory 64", await convert("gs://src/fuji/step_00001000", "gs", ["--memory", "64"]));
  const checked = await verify("gs://src/fuji/step_00001000", `${copied.out}/step_00001000`);
  row(`verify gs:// against gs://, 2 GB step (${checked.summary})`, checked);
}
console.log(["", "| conversion | peak RSS | wall | CPU (user+sys) |", "|---|---:|---:|---:|", ...rows].join("\n"));
stop(); // its folder is removed on exit (bench/fake-gcs.mjs)
