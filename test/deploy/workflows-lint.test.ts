import { spawnSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { parse } from "yaml";

// The GitHub Actions workflows (.github/workflows/): actionlint, pinned and installed into .tools/bin by
// scripts/install.sh, checks their syntax, expressions, action inputs and (with shellcheck on the PATH) their
// scripts; the rest is the project's own rules: actions pinned by commit, least privilege, CI is .ci/run.

const DIR = ".github/workflows";
const files = readdirSync(DIR)
  .filter((f) => /\.ya?ml$/.test(f))
  .map((f) => join(DIR, f));

interface Step {
  uses?: string;
  run?: string;
}
interface Job {
  permissions?: Record<string, string>;
  steps: Step[];
}
interface Workflow {
  on: Record<string, unknown>;
  permissions?: Record<string, string>;
  jobs: Record<string, Job>;
}
const workflow = (name: string) => parse(readFileSync(join(DIR, name), "utf8")) as Workflow;

function actionlint(): string | undefined {
  const local = ".tools/bin/actionlint";
  if (existsSync(local)) return local;
  const r = spawnSync("actionlint", ["-version"]);
  return r.error === undefined && r.status === 0 ? "actionlint" : undefined;
}
const lint = actionlint();
if (lint === undefined)
  process.stderr.write(
    "test/deploy/workflows-lint.test.ts: actionlint skipped: not in .tools/bin (npm run setup installs it) nor on the PATH\n",
  );

describe("the GitHub Actions workflows", () => {
  test.skipIf(lint === undefined)("pass actionlint", () => {
    const r = spawnSync(lint as string, ["-no-color", ...files], { encoding: "utf8" });
    expect(r.stdout + r.stderr).toBe("");
    expect(r.status).toBe(0);
  });

  test("pin every action by its full commit id, with the version in a comment", () => {
    const uses = files.flatMap((f) => [...readFileSync(f, "utf8").matchAll(/^\s*(?:- )?uses:\s*(.*)$/gm)].map((m) => `${f}: ${m[1]}`));
    expect(uses.length).toBeGreaterThan(0);
    expect(uses.filter((u) => !/: [\w.-]+\/[\w.-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+$/.test(u))).toEqual([]);
  });

  test("grant read access to the contents by default, and write access only to the job that publishes a release", () => {
    const writers: string[] = [];
    for (const name of ["ci.yml", "release.yml"]) {
      const w = workflow(name);
      expect(w.permissions).toEqual({ contents: "read" });
      for (const [id, job] of Object.entries(w.jobs))
        for (const [scope, level] of Object.entries(job.permissions ?? {}))
          if (level !== "read") writers.push(`${name} ${id}: ${scope} ${level}`);
    }
    expect(writers).toEqual(["release.yml publish: contents write"]);
  });

  test("CI runs .ci/run on every push and pull request", () => {
    const ci = workflow("ci.yml");
    expect(Object.keys(ci.on).sort()).toEqual(["pull_request", "push"]);
    expect(Object.values(ci.jobs).flatMap((j) => j.steps.map((s) => s.run))).toContain("bash .ci/run");
  });

  test("a release runs on a v* tag and builds with npm run release", () => {
    const release = workflow("release.yml");
    expect(release.on).toEqual({ push: { tags: ["v*"] } });
    expect(Object.values(release.jobs).flatMap((j) => j.steps.map((s) => s.run))).toContain("npm run release");
  });
});
