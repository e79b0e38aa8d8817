// The Workflows emulator's own unit tests (tools/workflows-emulator/tests, Python unittest): one case for each
// semantic wfemu_lib patches into the pinned workflows-emulator package, and the pin check itself. They run
// in-process in a few seconds; the other tests in this directory drive the emulator over HTTP.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { expect, test } from "vitest";

const PYTHON = ".venv-wfemu/bin/python";
const missing = existsSync(PYTHON) ? undefined : `${PYTHON} is missing: run scripts/install.sh first`;

test.skipIf(missing !== undefined)(
  "every semantic the emulator adds to workflows-emulator passes its unit test",
  () => {
    const run = spawnSync(PYTHON, ["-m", "unittest", "discover", "-s", "tools/workflows-emulator/tests"], {
      encoding: "utf8",
      // A broken assign lock or step counter hangs a workflow rather than failing it.
      timeout: 120_000,
    });
    expect(run.error, String(run.error)).toBeUndefined();
    expect(run.status, run.stderr).toBe(0);
    expect(run.stderr).toMatch(/^OK$/m);
  },
  150_000,
);

// Where it is missing, one skipped test says why (npm test lists it); where it is there, nothing.
if (missing !== undefined) test.skip(missing, () => {});
