#!/usr/bin/env node
// The Hugging Face export from gs://: the ~2 GB fuji-shaped step (bench/gen_fuji.py) in fake-gcs-server (its
// folder on tmpfs), read over plain HTTP and through bench/delay-proxy.mjs (every answer held --delay ms, 30 by
// default, as Cloud Storage takes tens of ms per request), side by side and interleaved, best of N:
//   (a) `orbax2reg export-hf gs://src/<step> OUT` (bfloat16, the default);
//   (b) `orbax2reg convert gs://src/<step> OUT --params-only --dtype bfloat16`: the baseline, which reads the same
//       parameters from the same source and writes the same bytes' worth (a/b wall target: at most 1.5x, as in
//       bench/export-hf.mjs from a local disk).
// Each run's output goes to a local folder, deleted before the next; (a)'s first one is checked with
// `orbax2reg verify`. The delay proxy counts the requests of each delayed run. See bench/README.md
// ("export-hf-gcs.mjs").
//
//   npm run build && node bench/export-hf-gcs.mjs [--runs N] [--delay MS]
import { existsSync, rmSync } from "node:fs";
import os from "node:os";
import { relative, resolve } from "node:path";
import { emulatorHolding, runTrustingTestCa, startDelayProxy } from "./fake-gcs.mjs";
import { flag, flags, fmt, fujiStep, must, ROOT, requireBuilt, say, sh, timed } from "./lib.mjs";

const { runs: RUNS, delay: DELAY } = flags(process.argv.slice(2), {
  "--runs": flag.count(3),
  "--delay": flag.number(30, { metavar: "MS" }),
});
requireBuilt();
await runTrustingTestCa();
process.chdir(ROOT);
const CLI = "bin/orbax2reg.js";
const OUT = resolve("bench/.generated", `export-hf-gcs-${process.pid}`);
const FS_ROOT = existsSync("/dev/shm") ? `/dev/shm/orbax2reg-bench-export-gcs-${process.pid}` : resolve(OUT, "fs");

say("# export-hf from gs:// (fake-gcs-server on loopback, plain and with every answer held)");
say();
say(`Machine: ${os.cpus().length} CPUs, node ${process.version}`);
const { info, dir: STEP, name: STEP_NAME, files } = fujiStep(".venv/bin/python");
const SRC = `ckpt/${STEP_NAME}`;
const { emulator } = await emulatorHolding(
  FS_ROOT,
  "src",
  files.map((f) => [f, `${SRC}/${relative(STEP, f)}`]),
);
const delayed = await startDelayProxy(emulator.plainUrl, DELAY);
say(`Source: ${info.step_dir} (${info.arrays} arrays) uploaded to gs://src/${SRC}`);
say();

const ROWS = [
  { row: "plain", url: emulator.plainUrl },
  { row: `${DELAY} ms`, url: delayed.url },
];
const ROUTES = [
  { route: "export-hf", argv: (out) => ["export-hf", `gs://src/${SRC}`, out, "--json"] },
  {
    route: "convert --params-only --dtype bfloat16",
    argv: (out) => ["convert", `gs://src/${SRC}`, out, "--params-only", "--dtype", "bfloat16", "--json"],
  },
];
const results = new Map();
say(`Runs (interleaved, best of ${RUNS}):`);
for (let round = 1; round <= RUNS; round++) {
  for (const { row, url } of ROWS) {
    for (const { route, argv } of ROUTES) {
      rmSync(OUT, { recursive: true, force: true });
      if (url === delayed.url) await delayed.reset();
      const r = must(await timed(process.execPath, [CLI, ...argv(OUT)], { ORBAX2REG_GCS_ENDPOINT: url }), `${route} (${row})`);
      const requests = url === delayed.url ? (await delayed.stats()).requests : undefined;
      const key = `${row}|${route}`;
      results.set(key, [...(results.get(key) ?? []), { ...r, requests }]);
      say(
        `  ${round}. ${row.padEnd(6)} ${route.padEnd(40)} ${fmt(r.seconds).padStart(6)} s  CPU ${fmt(r.cpu).padStart(6)} s  ` +
          `peak RSS ${fmt(r.rssKiB / 1024, 0).padStart(4)} MiB${requests === undefined ? "" : `; ${requests} requests`}`,
      );
      if (round === 1 && route === "export-hf" && row === "plain") {
        const v = sh(process.execPath, [CLI, "verify", `gs://src/${SRC}`, OUT, "--json"], {
          env: { ...process.env, ORBAX2REG_GCS_ENDPOINT: url },
        });
        const j = v.status === 0 || v.status === 4 ? JSON.parse(v.stdout) : { passed: 0, failed: 1 };
        say(`     verify of the export: ${j.passed} passed, ${j.failed} failed`);
        if (v.status !== 0) process.exitCode = 1;
      }
    }
  }
}
rmSync(OUT, { recursive: true, force: true });
say();

const best = (key) => results.get(key).reduce((a, b) => (b.seconds < a.seconds ? b : a));
say(
  "| source | export-hf: wall, CPU, peak RSS | convert --params-only --dtype bfloat16: wall, CPU, peak RSS | wall ratio (target <= 1.5x) |",
);
say("|---|---|---|---:|");
for (const { row } of ROWS) {
  const a = best(`${row}|export-hf`);
  const b = best(`${row}|convert --params-only --dtype bfloat16`);
  const cell = (r) =>
    `${fmt(r.seconds)} s, ${fmt(r.cpu)} s CPU, ${fmt(r.rssKiB / 1024, 0)} MiB${r.requests === undefined ? "" : ` (${r.requests} requests)`}`;
  const ratio = a.seconds / b.seconds;
  if (ratio > 1.5) process.exitCode = 1;
  say(`| gs://, ${row === "plain" ? "plain HTTP" : `every answer held ${row}`} | ${cell(a)} | ${cell(b)} | ${fmt(ratio)}x |`);
}
delayed.stop();
emulator.stop(); // its folder is removed on exit (bench/fake-gcs.mjs)
