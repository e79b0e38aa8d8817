// The docs' examples are run: every `$ command` transcript in README.md, docs/install.md and docs/cli.md, through
// the CLI installed from the package's own tarball into a fresh prefix (as a user installs it), its output
// compared with the docs' (times and sizes masked, `…` for elided lines). A command or an output in the docs
// cannot go stale.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { HF_PYTHON as HF_VENV_PYTHON } from "../helpers/paths.js";
import { run } from "../helpers/run.js";
import { tempDir } from "../helpers/tmp.js";
import { compareOutput, type Transcript, transcripts } from "../helpers/transcript.js";

const DOCS = ["README.md", "docs/install.md", "docs/cli.md"];
const AXLEARN_PYTHON = resolve(".venv-axlearn/bin/python");
/** The export's consumers (transformers, torch): setup's .venv-hf. */
const HF_PYTHON = resolve(HF_VENV_PYTHON);

/** A transcript that runs `transformers` (a command, or a file it shows with `cat`, names it): .venv-hf's python runs it. */
const needsHf = (b: Transcript) =>
  b.steps.some(
    (s) => /\btransformers\b/.test(s.command) || (/^cat /.test(s.command) && s.expected.some((l) => /\btransformers\b/.test(l))),
  );

let prefix = "";

beforeAll(async () => {
  const dir = tempDir("docs-install");
  // Asynchronous: packing builds and installing takes a minute or more (test/helpers/run.ts says why that matters).
  const pack = await run("npm", ["pack", "--json", "--pack-destination", dir]);
  if (pack.code !== 0) throw new Error(`npm pack failed: ${pack.stderr}`);
  const tarball = join(dir, JSON.parse(pack.stdout.slice(pack.stdout.search(/^\[/m)))[0].filename);
  prefix = join(dir, "prefix");
  // The user's command (README, "Install"), into a prefix of its own.
  const install = await run("npm", ["install", "-g", "--no-audit", "--no-fund", tarball], {
    env: { ...process.env, npm_config_prefix: prefix },
  });
  if (install.code !== 0) throw new Error(`npm install -g of the tarball failed: ${install.stderr}`);
}, 600_000);

/** Runs one document's transcripts in order in one working folder: later examples use what earlier ones wrote. */
async function runDocument(doc: string, blocks: Transcript[]): Promise<void> {
  const work = tempDir(`docs-${doc.replace(/\W/g, "-")}`);
  mkdirSync(join(work, "tmp"), { recursive: true });
  // The docs write under /tmp/; the test gives each document a /tmp of its own.
  const local = (s: string) => s.replaceAll("/tmp/", `${work}/tmp/`);
  const env = {
    ...process.env,
    npm_config_prefix: prefix,
    // `python` is AXLearn's venv's, where setup made one (its examples skip otherwise).
    PATH: `${join(prefix, "bin")}:${existsSync(AXLEARN_PYTHON) ? `${resolve(".venv-axlearn/bin")}:` : ""}${process.env.PATH}`,
    JAX_PLATFORMS: "cpu",
    TF_CPP_MIN_LOG_LEVEL: "3",
    COLUMNS: "120",
  };
  // `NAME=value` lines the docs set for later commands (a shell would keep them): run before each later command.
  let prelude = "";
  for (const block of blocks) {
    for (const step of block.steps) {
      const where = `${doc}:${block.line}: $ ${step.command}`;
      // `$ cat FILE` of a file the docs show but the user writes: the docs' text is the file.
      const file = /^cat (\S+)$/.exec(step.command)?.[1];
      if (file !== undefined && !file.startsWith("/") && !existsSync(join(work, file))) {
        writeFileSync(join(work, file), `${step.expected.map(local).join("\n")}\n`);
      }
      const command = local(step.command);
      // `python` of a transformers transcript is .venv-hf's (torch and transformers), ahead of AXLearn's.
      const blockEnv = needsHf(block) ? { ...env, PATH: `${dirname(HF_PYTHON)}:${env.PATH}` } : env;
      const r = await run("bash", ["-c", `${prelude}${command} 2>&1`], { cwd: work, env: blockEnv, timeout: 300_000 });
      if (/^[A-Za-z_][A-Za-z0-9_]*=\S/.test(step.command) && step.expected.length === 0) prelude += `${command}; `;
      const printed = (r.stdout ?? "").split("\n");
      const difference = compareOutput(step.expected.map(local), printed);
      expect(difference, `${where}\n${difference}\n--- printed:\n${r.stdout}`).toBeNull();
    }
  }
}

for (const doc of DOCS) {
  const blocks = transcripts(readFileSync(doc, "utf8"));
  const needsAxlearn = (b: Transcript) => b.steps.some((s) => /(^|\s)python\s/.test(s.command));
  // The container's examples run in test/deploy/image.test.ts, against the image it builds.
  const container = (b: Transcript) => b.steps.some((s) => /^(docker|podman) /.test(s.command));
  // A transformers transcript loads what an earlier example exported from the package's own fuji example.
  const hfReady = existsSync(HF_PYTHON);
  const runnable = blocks.filter((b) => !container(b) && (needsHf(b) ? hfReady : existsSync(AXLEARN_PYTHON) || !needsAxlearn(b)));
  describe(`${doc}'s examples`, () => {
    test(`its ${runnable.length} transcripts print what the docs show`, async () => {
      expect(runnable.length).toBeGreaterThan(0);
      await runDocument(doc, runnable);
    }, 900_000);
    // What cannot run here is one skipped test saying why (npm test lists it); nothing where it runs.
    if (!existsSync(AXLEARN_PYTHON) && blocks.some(needsAxlearn))
      test.skip("its AXLearn examples: .venv-axlearn is absent (ORBAX2REG_AXLEARN names AXLearn's source for setup)", () => {});
    if (!hfReady && blocks.some(needsHf))
      test.skip("its transformers examples: .venv-hf is absent (scripts/install.sh makes it)", () => {});
  });
}
