// export-hf's destination: the small files an export writes are named in its record; a folder holding another
// checkpoint's files is refused before anything is written, and --force removes them; no temporary file of an
// interrupted write survives a rerun; verify fails on weight files the index does not name. Through the CLI, on
// a small fuji-shaped regular step (no Python needed).
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { RECORD_NAME } from "../../src/hf/record.js";
import { runCli } from "../helpers/cli.js";
import { tempDir } from "../helpers/tmp.js";
import { fujiArrays, writeRegularStep } from "./fuji-tree.js";

const DIMS = { layers: 2, dim: 32, heads: 4, kvHeads: 2, headDim: 8, ffn: 48, vocab: 40 };

/** A fresh folder holding a small fuji step (`step`) and the path of a destination beside it (`dest`). */
function setup(): { root: string; step: string; dest: string } {
  const root = tempDir("hf-dest");
  writeRegularStep(join(root, "step"), fujiArrays(DIMS, 3), (a) => [...a.shape]);
  return { root, step: join(root, "step"), dest: join(root, "hf") };
}

const exportHf = (step: string, dest: string, ...extra: string[]) => runCli(["export-hf", step, dest, "--no-progress", ...extra]);

describe("the small files an export writes besides its shards", () => {
  test("are named in the export's record with their sha256", async () => {
    const { step, dest } = setup();
    expect((await exportHf(step, dest)).code).toBe(0);
    const record = JSON.parse(readFileSync(join(dest, RECORD_NAME), "utf8"));
    expect(record.files.map((f: { name: string }) => f.name)).toEqual(["config.json", "generation_config.json"]);
    const config = readFileSync(join(dest, "config.json"));
    expect(record.files[0]).toEqual({
      name: "config.json",
      bytes: config.length,
      sha256: createHash("sha256").update(config).digest("hex"),
    });
  });

  test("verify fails, naming the file, when one was changed after the export (exit 4)", async () => {
    const { step, dest } = setup();
    expect((await exportHf(step, dest)).code).toBe(0);
    const ok = await runCli(["verify", step, dest, "--no-progress"]);
    expect(ok.code, ok.stdout).toBe(0);
    writeFileSync(join(dest, "generation_config.json"), '{"do_sample": true}\n');
    const bad = await runCli(["verify", step, dest, "--no-progress"]);
    expect(bad.code).toBe(4);
    expect(bad.stdout).toMatch(/^FAIL generation_config\.json: not the bytes the export wrote/m);
  });
});
