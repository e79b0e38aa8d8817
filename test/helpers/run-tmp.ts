// A test run's own temporary folder. The global setup makes it and points TMPDIR at it before any worker, server
// or generator starts, so that everything the run makes with Node's os.tmpdir(), Python's tempfile, terraform
// (Go's os.TempDir) or podman lands in it, and removes it when the run ends: no test has to remember to clean up,
// and a run killed half-way leaves one folder, not hundreds. One level only, with a short name: terraform's
// providers (go-plugin) and Python's multiprocessing make Unix sockets in TMPDIR, whose paths hold 108 bytes at most.
import { mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";

/** Set to 1, the run's folder is kept (and where is printed), to read what a run left. */
export const KEEP_TMP = "ORBAX2REG_KEEP_TMP";

export interface RunTmp {
  readonly dir: string;
  /** Removes the folder (once; synchronous, so that it can run in an "exit" handler), or says where it is kept. */
  end(): void;
}

/** Makes `orbax2reg-test-XXXXXX` under `base` (the system's temporary folder as the run found it). */
export function makeRunTmp(
  base: string,
  env: NodeJS.ProcessEnv = process.env,
  say: (line: string) => void = (line) => process.stderr.write(line),
): RunTmp {
  const dir = mkdtempSync(join(base, "orbax2reg-test-"));
  const keep = env[KEEP_TMP] === "1";
  let ended = false;
  return {
    dir,
    end: () => {
      if (ended) return;
      ended = true;
      if (keep) say(`${KEEP_TMP}=1: kept this run's temporary files in ${dir}\n`);
      else {
        try {
          rmSync(dir, { recursive: true, force: true, maxRetries: 3 });
        } catch (e) {
          // Something still writing into it (a run interrupted while its processes ran): say so, do not throw
          // from an exit handler.
          say(`could not remove this run's temporary folder ${dir}: ${(e as Error).message}\n`);
        }
      }
    },
  };
}
