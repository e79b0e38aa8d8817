// The Cloud Run job image's entry point: `node dist/jobs/main.js plan|convert-group|finalize` (what
// terraform's jobs.tf runs). The job itself is src/cloud/job/run.ts; this is its launcher.
//
// CommonJS on purpose, as bin/orbax2reg.js is (jobs/package.json says so, and the build copies that file to
// dist/jobs/): libuv sizes its thread pool when it is first used, and loading an ES module may already use it
// (Node 20's loader reads files through it), so only a CommonJS entry can size it in time. The jobs get the
// CLI's 16 threads: a convert-group task keeps dozens of objects in flight, and the default 4 would queue
// their file system work (and zstd's, and the addon's) behind one another.
import type * as Run from "../src/cloud/job/run.js";

process.env.UV_THREADPOOL_SIZE ??= "16";

/** Runs one phase and returns the process exit code (src/cloud/job/run.ts, runJob). */
export async function runJob(...args: Parameters<typeof Run.runJob>): ReturnType<typeof Run.runJob> {
  return (await import("../src/cloud/job/run.js")).runJob(...args);
}

// Run when executed directly (not when imported by tests).
if (typeof module !== "undefined" && require.main === module) {
  import("../src/cloud/job/run.js").then(
    (run) => run.main(process.argv.slice(2)),
    (e: unknown) => {
      // Not even the job's code loaded (a broken image): one line for Cloud Logging all the same.
      process.stdout.write(
        `${JSON.stringify({ severity: "ERROR", message: `cannot load the job: ${String(e)}`, component: "orbax2reg-job" })}\n`,
      );
      process.exitCode = 1;
    },
  );
}
