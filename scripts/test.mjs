#!/usr/bin/env node
// `npm test`: type-check, lint, build the CLI, run every vitest suite (whose global setup starts the
// emulators and generates the real Orbax fixtures), then print one closing line "N passed, M failed".
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync } from "node:fs";

const run = (cmd, args) => spawnSync(cmd, args, { stdio: "inherit" }).status ?? 1;
const checks = [
  ["npx", ["tsc", "-p", "tsconfig.json", "--noEmit"]],
  ["npx", ["biome", "check", "."]],
  ["npx", ["tsc", "-p", "tsconfig.build.json"]],
];
let failedChecks = 0;
for (const [cmd, args] of checks) if (run(cmd, args) !== 0) failedChecks++;

mkdirSync(".cache", { recursive: true });
const report = ".cache/vitest-report.json";
const status = run("npx", [
  "vitest",
  "run",
  "--reporter=default",
  "--reporter=json",
  `--outputFile.json=${report}`,
  ...process.argv.slice(2),
]);
let passed = 0;
let failed = failedChecks;
try {
  const r = JSON.parse(readFileSync(report, "utf8"));
  passed = r.numPassedTests;
  failed += r.numFailedTests + (r.numTotalTestSuites > 0 && r.success === false && r.numFailedTests === 0 ? 1 : 0);
} catch {
  failed += 1;
}
if (status !== 0 && failed === 0) failed = 1;
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
