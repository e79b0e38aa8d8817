#!/usr/bin/env -S MALLOC_ARENA_MAX=1 node --max-semi-space-size=1 --initial-old-space-size=64
// Thin launcher: the CLI is compiled to dist/ by `npm install` (the `prepare` script).
//
// Run as a command (npx, npm's bin link), the runtime is set for a process that moves bytes and keeps little
// alive (`node bin/orbax2reg.js` runs without these): V8's young generation at most 1 MiB a semi-space, what
// V8 itself picks under a 512 MiB limit (https://nodejs.org/api/cli.html#--max-semi-space-sizesize), instead
// of growing to 16 MiB under the churn of a conversion's pieces; and one glibc malloc arena, instead of one per
// thread for V8's and libuv's threads. Together 19-20 MiB less peak RSS on `bench:gcs`, at the same CPU.
// V8's old generation starts at 64 MiB: under a small young generation the JS objects of many reads in flight
// are promoted, and V8 kept re-marking an old generation of 9-17 MB (export-hf of a source cut 1,024 ways: 34
// mark-compacts, 14 with it, ~10 % less CPU, for 15-25 MiB more peak RSS). bench/README.md has the figures. The job image starts its entry point the same way (Dockerfile).
//
// CommonJS on purpose (bin/package.json says so, so the file keeps its name for npx and npm's bin links): libuv
// sizes its thread pool when it is first used, and loading an ES module already uses it (the loader reads
// files through it), so only a CommonJS entry can size it in time. Local writes flush every object to the
// disk in the background; a flush holds a pool thread until the disk has the bytes, and with the default 4
// threads a few flushes stall every other read and write.
"use strict";
process.env.UV_THREADPOOL_SIZE ??= "16";

// Last resorts, so that no failure ends silently: an error nobody awaited is reported in one line (exit 1),
// and if the event loop ever empties while the command is still waiting on something that can no longer
// happen (Node would exit 13 and print nothing), the exit says so and is 1 ("unexpected failure").
let settled = false;
process.on("unhandledRejection", (e) => {
  process.stderr.write(`orbax2reg: unexpected error: ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}\n`);
  process.exit(1);
});
process.on("exit", () => {
  if (settled) return;
  process.stderr.write("orbax2reg: unexpected error: the command stopped while still waiting for an operation to finish\n");
  process.exitCode = 1;
});

// A reader that closed its end of the pipe (`orbax2reg inspect STEP | head -1`) wants no more output: the
// command ends there, quietly, as a process killed by SIGPIPE does (`git log | head`), with the status such a
// process has in the shell, 141 (128 + SIGPIPE's 13). Node ignores SIGPIPE, so the write fails with EPIPE
// instead, as an 'error' event that would otherwise end the process with a stack trace. A conversion stopped
// this way resumes when run again, as after any interruption.
const SIGPIPE_STATUS = 141;
for (const stream of [process.stdout, process.stderr]) {
  stream.on("error", (e) => {
    if (e.code !== "EPIPE") throw e;
    settled = true;
    process.exit(SIGPIPE_STATUS);
  });
}

// An install whose native zstd addon was not built would fail at its first chunk with a stack trace: npm 12
// runs a dependency's install script only when allowed (`--allow-scripts=zstd-napi`), and that script builds
// or downloads build/Release/binding.node. Checked by the file's presence: loading it here would cost every run.
const { existsSync } = require("node:fs");
const { dirname, join } = require("node:path");
let addon;
try {
  addon = join(dirname(require.resolve("zstd-napi/package.json")), "build", "Release", "binding.node");
} catch {
  addon = undefined; // not installed at all: the import below says so
}
if (addon !== undefined && !existsSync(addon)) {
  process.stderr.write(
    `orbax2reg: the native zstd addon was not built at install (${addon} is missing): reinstall with npm install -g --allow-scripts=zstd-napi, as README.md's "Install" shows\n`,
  );
  settled = true;
  process.exitCode = 1;
} else {
  start();
}

function start() {
  (async () => {
    const { main } = await import("../dist/src/cli/main.js");
    const { retryStats } = await import("../dist/src/store/retry.js");
    process.exitCode = await main(process.argv.slice(2));
    settled = true;
    // A run that succeeded only thanks to retries says so (a failed one already said what failed, and after how many attempts).
    const { retries, byKind } = retryStats();
    if (retries > 0 && process.exitCode === 0) {
      const kinds = Object.entries(byKind).map(([k, n]) => `${k}: ${n}`);
      process.stderr.write(`orbax2reg: ${retries} storage request${retries === 1 ? " was" : "s were"} retried (${kinds.join(", ")})\n`);
    }
  })();
}
