#!/usr/bin/env node
// `npm test`: type-check, lint, build the CLI, run every vitest suite (whose global setup starts the
// emulators and generates the real Orbax fixtures), then say what skipped and why, and print one closing line
// "N passed, M failed" (CI reads it: it stays the last line).
import { spawn, spawnSync } from "node:child_process";
import { mkdirSync, readFileSync } from "node:fs";
import { relative } from "node:path";

const run = (cmd, args) => spawnSync(cmd, args, { stdio: "inherit" }).status ?? 1;
const checks = [
  ["npx", ["tsc", "-p", "tsconfig.json", "--noEmit"]],
  ["npx", ["biome", "check", "."]],
  ["npx", ["tsc", "-p", "tsconfig.build.json"]],
];
/** The titles listed of one file's skipped tests; a file that skips a whole group has many. */
const MAX_TITLES = 8;
let failedChecks = 0;
for (const [cmd, args] of checks) if (run(cmd, args) !== 0) failedChecks++;

mkdirSync(".cache", { recursive: true });
const report = ".cache/vitest-report.json";
const { status, said } = await vitest([
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
  console.log(skippedSummary(r, said));
} catch {
  failed += 1;
}
if (status !== 0 && failed === 0) failed = 1;
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);

/**
 * Runs vitest, its output passed through as it comes; of its stderr, the lines that say why something skips
 * (a test file's or the global setup's "... skipped: why", "skipping ...: why") are kept for the summary.
 */
function vitest(args) {
  const child = spawn("npx", ["vitest", ...args], { stdio: ["inherit", "inherit", "pipe"] });
  const said = [];
  let partial = "";
  child.stderr.on("data", (chunk) => {
    process.stderr.write(chunk);
    const lines = (partial + chunk).split("\n");
    partial = lines.pop() ?? "";
    for (const line of lines) if (/\bskip(ped|ping)\b/i.test(line) && !said.includes(line.trim())) said.push(line.trim());
  });
  return new Promise((resolve) => child.on("close", (code) => resolve({ status: code ?? 1, said })));
}

/**
 * What skipped, from vitest's JSON report: each file's skipped and todo tests by their titles (which say why,
 * by this project's convention, or belong to a group a file skips whole), then what the tests said on stderr.
 */
function skippedSummary(r, said) {
  const files = [];
  for (const file of r.testResults) {
    const titles = file.assertionResults
      .filter((a) => a.status === "skipped" || a.status === "pending" || a.status === "todo")
      .map((a) => [...a.ancestorTitles, a.title].join(" > ") + (a.status === "todo" ? " (todo)" : ""));
    if (titles.length > 0) files.push({ name: relative(process.cwd(), file.name), titles });
  }
  if (files.length === 0) return "skipped: none";
  const count = files.reduce((n, f) => n + f.titles.length, 0);
  const lines = [`skipped: ${count} test${count === 1 ? "" : "s"} in ${files.length} file${files.length === 1 ? "" : "s"}`];
  for (const f of files) {
    lines.push(`  ${f.name} (${f.titles.length}):`);
    for (const t of f.titles.slice(0, MAX_TITLES)) lines.push(`    ${t}`);
    if (f.titles.length > MAX_TITLES) lines.push(`    … and ${f.titles.length - MAX_TITLES} more`);
  }
  if (said.length > 0) lines.push("why, as the tests said it:", ...said.map((s) => `  ${s}`));
  return lines.join("\n");
}
