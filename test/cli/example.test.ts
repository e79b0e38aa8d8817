// `orbax2reg example NAME`: the path of an example step the package carries, found from the installed code (so a
// `--prefix` install, which `npm root -g` does not know, works too).
import { existsSync } from "node:fs";
import { join } from "node:path";
import { expect, test } from "vitest";
import { runCli } from "../helpers/cli.js";

test.each([
  ["orbax", "step_00000100"],
  ["fuji", "step_00001000"],
])("example %s prints the path of a step the package carries", async (name, step) => {
  const r = await runCli(["example", name]);
  expect(r.code, r.stderr).toBe(0);
  const path = r.stdout.trim();
  expect(path.endsWith(step)).toBe(true);
  expect(existsSync(join(path, "_CHECKPOINT_METADATA"))).toBe(true);
});

test("an unknown example is a usage error naming the ones there are", async () => {
  const r = await runCli(["example", "llama"]);
  expect(r.code).toBe(2);
  expect(r.stderr).toMatch(/no example "llama": orbax or fuji/);
});
