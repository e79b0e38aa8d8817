// The fault soak (`npm run test:faults`): many `convert` runs of the tiny fixture, gs:// -> gs://, through the
// fault-injecting proxy, each checked with `verify` (through the same faults). Prints a table: runs, faults
// injected by kind, retries the runs reported, outcomes, and the slowdown against runs without faults.
// SOAK_RUNS (default 50) runs per faulty mix, SOAK_SECONDS (default 900) bounds the whole soak.
import { mkdirSync, writeFileSync } from "node:fs";
import { afterAll, beforeAll, expect, inject, test } from "vitest";
import { runBinAsync } from "../helpers/cli.js";
import { fixtureCase } from "../helpers/convert.js";
import { newBucket, uploadDir } from "../helpers/gcs.js";
import { type FaultKind, type FaultProxy, startFaultProxy } from "./proxy.js";

const RUNS = Number(process.env.SOAK_RUNS ?? 50);
const BUDGET_MS = Number(process.env.SOAK_SECONDS ?? 900) * 1000;
const STEP = "ckpt/step_00000100";

interface Mix {
  readonly name: string;
  readonly rates: Partial<Record<FaultKind, number>>;
  readonly runs: number;
  readonly env?: Record<string, string>;
}

const MIXES: Mix[] = [
  { name: "no faults (baseline)", rates: {}, runs: Math.max(5, Math.round(RUNS / 5)) },
  { name: "5% 503 + 1% resets", rates: { "503": 0.05, reset: 0.005, "reset-mid-body": 0.005 }, runs: RUNS },
  { name: "10% 429", rates: { "429": 0.1 }, runs: Math.round(RUNS / 2) },
  {
    name: "everything (2 s stall timeout)",
    rates: {
      "503": 0.05,
      "429": 0.02,
      reset: 0.01,
      "reset-mid-body": 0.01,
      truncate: 0.01,
      stall: 0.005,
      "stall-headers": 0.005,
      "corrupt-upload": 0.01,
      delay: 0.02,
    },
    runs: Math.round(RUNS / 2),
    env: { ORBAX2REG_GCS_STALL_MS: "2000" },
  },
];

let src: string;
let dst: string;
const started = Date.now();
const rows: string[] = [];

beforeAll(async () => {
  src = await newBucket("soak-src");
  dst = await newBucket("soak-dst");
  await uploadDir(fixtureCase("tiny").location, src, STEP);
});

afterAll(() => {
  const table = [
    "| mix | runs | converted and verified | failed | faults injected, convert + verify (by kind) | retries reported, convert + verify (total, max per run) | median convert | slowdown |",
    "|---|---:|---:|---:|---|---:|---:|---:|",
    ...rows,
  ].join("\n");
  console.log(`\n${table}\n`);
  mkdirSync(".cache", { recursive: true });
  writeFileSync(".cache/faults-soak.md", `${table}\n`);
});

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN;
let baseline = Number.NaN;

test("soak", async () => {
  let seed = 1000;
  for (const mix of MIXES) {
    const proxy: FaultProxy = await startFaultProxy({ upstream: inject("gcsEndpoint"), seed: seed++, rates: mix.rates, delayMs: 50 });
    const env = { ORBAX2REG_GCS_ENDPOINT: proxy.url, ...mix.env };
    const times: number[] = [];
    const retries: number[] = [];
    const failures: string[] = [];
    let runs = 0;
    try {
      for (let i = 0; i < mix.runs && Date.now() - started < BUDGET_MS; i++) {
        runs++;
        const out = `gs://${dst}/${mix.name.replace(/\W+/g, "-")}-${i}`;
        const t0 = performance.now();
        const convert = await runBinAsync(["convert", `gs://${src}/${STEP}`, out], env);
        const ms = performance.now() - t0;
        const verify = convert.code === 0 ? await runBinAsync(["verify", `gs://${src}/${STEP}`, `${out}/step_00000100`], env) : undefined;
        const said = (stderr: string) => Number(/(\d+) storage requests? (?:was|were) retried/.exec(stderr)?.[1] ?? 0);
        retries.push(said(convert.stderr) + said(verify?.stderr ?? ""));
        if (convert.code === 0 && verify?.code === 0) times.push(ms);
        else
          failures.push(
            `exit ${convert.code}/${verify?.code ?? "-"}: ${(convert.stderr + (verify?.stdout ?? "")).trim().split("\n").at(-1)}`,
          );
      }
    } finally {
      await proxy.close();
    }
    const med = median(times);
    if (Object.keys(mix.rates).length === 0) baseline = med;
    const kinds = Object.entries(proxy.stats.faults)
      .map(([k, n]) => `${k} ${n}`)
      .join(", ");
    const total = retries.reduce((a, b) => a + b, 0);
    rows.push(
      `| ${mix.name} | ${runs} | ${times.length} | ${failures.length} | ${kinds || "none"} (of ${proxy.stats.requests} requests) | ${total}, ${Math.max(0, ...retries)} | ${(med / 1000).toFixed(2)} s | ${(med / baseline).toFixed(2)}x |`,
    );
    for (const f of failures.slice(0, 5)) console.log(`${mix.name}: ${f}`);
    expect.soft(failures, mix.name).toEqual([]);
  }
});
