// export-hf's destination: the small files an export writes are named in its record; a folder holding another
// checkpoint's files is refused before anything is written, and --force removes them; no temporary file of an
// interrupted write survives a rerun; verify fails on weight files the index does not name; transformers (where
// .venv-hf is) loads the export, not a model.safetensors dropped beside it. Through the CLI, on a small
// fuji-shaped regular step.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, unlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { RECORD_NAME } from "../../src/hf/record.js";
import { runCli } from "../helpers/cli.js";
import { emulatorStorage, newBucket } from "../helpers/gcs.js";
import { HF_PYTHON } from "../helpers/paths.js";
import { run } from "../helpers/run.js";
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

/** Every file of a folder (hidden ones too) with its bytes. */
function snapshot(dir: string): Map<string, Buffer> {
  return new Map(readdirSync(dir).map((f) => [f, readFileSync(join(dir, f))]));
}

/** A dead writer's temporary name for `key`, as LocalStore names one (pid above any pid_max: no such process). */
const abandoned = (key: string) => `${key}.tmp-7fffff000001`;

describe("a destination holding another checkpoint's files", () => {
  const OTHERS = [
    "model.safetensors",
    "pytorch_model.bin",
    "model-00001-of-00003.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "config.json",
  ];

  test("is refused before anything is written, naming the files and --force (exit 2)", async () => {
    const { step, dest } = setup();
    mkdirSync(dest);
    for (const f of ["model.safetensors", "tokenizer.json", "README.md"]) writeFileSync(join(dest, f), `${f} of another model`);
    const before = snapshot(dest);
    const r = await exportHf(step, dest);
    expect(r.code).toBe(2);
    expect(r.stderr.trim()).toBe(
      `orbax2reg: ${dest}: holds files of another checkpoint (model.safetensors, tokenizer.json), not this export's; --force removes them`,
    );
    expect(snapshot(dest)).toEqual(before);
  });

  test("is refused naming at most five of its files and how many more", async () => {
    const { step, dest } = setup();
    mkdirSync(dest);
    for (const f of OTHERS) writeFileSync(join(dest, f), "x");
    const r = await exportHf(step, dest);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(
      "(config.json, model-00001-of-00003.safetensors, model.safetensors, model.safetensors.index.json, pytorch_model.bin and 1 more)",
    );
  });

  for (const other of [
    ...OTHERS,
    "tf_model.h5",
    "flax_model.msgpack",
    "consolidated.00.pth",
    "tokenizer.model",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
    "adapter_config.json",
  ]) {
    test(`counts ${other} as another checkpoint's`, async () => {
      const { step, dest } = setup();
      mkdirSync(dest);
      writeFileSync(join(dest, other), "x");
      const r = await exportHf(step, dest);
      expect(r.code).toBe(2);
      expect(r.stderr).toContain(`(${other})`);
    });
  }

  test("counts no other file: README.md and .gitattributes stay, through --force too", async () => {
    const { step, dest } = setup();
    mkdirSync(dest);
    writeFileSync(join(dest, "README.md"), "# a model card\n");
    writeFileSync(join(dest, ".gitattributes"), "*.safetensors filter=lfs\n");
    expect((await exportHf(step, dest)).code).toBe(0);
    expect((await exportHf(step, dest, "--dtype", "float32", "--force")).code).toBe(0);
    expect(readFileSync(join(dest, "README.md"), "utf8")).toBe("# a model card\n");
    expect(readdirSync(dest)).toContain(".gitattributes");
  });

  test("--force removes every one of them, and the export is what is left", async () => {
    const { step, dest } = setup();
    mkdirSync(dest);
    for (const f of OTHERS) writeFileSync(join(dest, f), "x");
    const r = await exportHf(step, dest, "--force");
    expect(r.code, r.stderr).toBe(0);
    expect(readdirSync(dest).sort()).toEqual([
      RECORD_NAME,
      "config.json",
      "generation_config.json",
      "model-00001-of-00001.safetensors",
      "model.safetensors.index.json",
    ]);
    expect(readFileSync(join(dest, "config.json"), "utf8")).toContain('"LlamaForCausalLM"');
  });

  test("a rerun of the same export is not refused by its own files", async () => {
    const { step, dest } = setup();
    expect((await exportHf(step, dest)).code).toBe(0);
    const r = await exportHf(step, dest, "--json");
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout).alreadyExported).toBe(true);
  });

  test("a file of the export's changed since is another's: refused, and --force writes the export's again", async () => {
    const { step, dest } = setup();
    expect((await exportHf(step, dest)).code).toBe(0);
    const config = readFileSync(join(dest, "config.json"));
    writeFileSync(join(dest, "config.json"), '{"model_type": "gpt2"}\n');
    const r = await exportHf(step, dest);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("(config.json)");
    expect((await exportHf(step, dest, "--force")).code).toBe(0);
    expect(readFileSync(join(dest, "config.json")).equals(config)).toBe(true);
  });

  test("shards and an index no record names (another tool's, or an export whose record is gone) are another's", async () => {
    const { step, dest } = setup();
    expect((await exportHf(step, dest)).code).toBe(0);
    unlinkSync(join(dest, RECORD_NAME));
    const r = await exportHf(step, dest);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("(config.json, generation_config.json, model-00001-of-00001.safetensors, model.safetensors.index.json)");
  });

  test("on gs:// the same: refused naming the files, nothing written; --force removes them", async () => {
    const { step } = setup();
    const bucket = await newBucket("hfdest");
    const dest = `gs://${bucket}/fuji`;
    const objects = async () => (await emulatorStorage().bucket(bucket).getFiles({ prefix: "fuji/" }))[0].map((f) => f.name).sort();
    await emulatorStorage().bucket(bucket).file("fuji/model.safetensors").save("x");
    await emulatorStorage().bucket(bucket).file("fuji/tokenizer_config.json").save("{}");
    const r = await exportHf(step, dest);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`${dest}: holds files of another checkpoint (model.safetensors, tokenizer_config.json)`);
    expect(await objects()).toEqual(["fuji/model.safetensors", "fuji/tokenizer_config.json"]);
    expect((await exportHf(step, dest, "--force")).code).toBe(0);
    expect(await objects()).not.toContain("fuji/model.safetensors");
    expect(await objects()).not.toContain("fuji/tokenizer_config.json");
  });
});

describe("what interrupted writes left", () => {
  test("a resumed export removes a shard's temporary file", async () => {
    const { step, dest } = setup();
    expect((await exportHf(step, dest, "--max-shard-size", "10KB")).code).toBe(0);
    const shards = readdirSync(dest)
      .filter((f) => f.endsWith(".safetensors"))
      .sort();
    expect(shards.length).toBeGreaterThan(2);
    // What a kill while writing the second shard leaves: no index, no second shard, its temporary file.
    unlinkSync(join(dest, "model.safetensors.index.json"));
    unlinkSync(join(dest, shards[1] as string));
    writeFileSync(join(dest, abandoned(shards[1] as string)), "half a shard");
    const r = await exportHf(step, dest, "--max-shard-size", "10KB", "--json");
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout).resumed).toBe(true);
    expect(readdirSync(dest).filter((f) => f.includes(".tmp-"))).toEqual([]);
  });

  test("a forced export removes the temporary files of another export's shards and small files", async () => {
    const { step, dest } = setup();
    expect((await exportHf(step, dest)).code).toBe(0);
    for (const k of ["model-00002-of-00004.safetensors", "config.json", "model.safetensors.index.json"])
      writeFileSync(join(dest, abandoned(k)), "x");
    const r = await exportHf(step, dest, "--dtype", "float32", "--force");
    expect(r.code, r.stderr).toBe(0);
    expect(readdirSync(dest).filter((f) => f.includes(".tmp-"))).toEqual([]);
  });

  test("a different export taking over an unfinished one removes all its shards before writing its record", async () => {
    const { root, step, dest } = setup();
    expect((await exportHf(step, dest)).code).toBe(0);
    unlinkSync(join(dest, "model.safetensors.index.json"));
    // Another source of the same shapes, so the same shard name and header: it fails while writing that shard.
    const other = join(root, "other");
    writeRegularStep(other, fujiArrays(DIMS, 5), (a) => [...a.shape]);
    writeFileSync(join(other, "gda/model/decoder/output_norm/scale/0"), "not zstd");
    const r = await exportHf(other, dest);
    expect(r.code).not.toBe(0);
    expect(readdirSync(dest).sort()).toEqual([RECORD_NAME]);
  });
});

const hasScript = spawnSync("script", ["--version"]).status === 0;

describe.skipIf(!hasScript)("on a terminal (script(1) gives the CLI one)", () => {
  test("a refused destination prints its one line and no progress bar", async () => {
    const { step, dest } = setup();
    mkdirSync(dest);
    writeFileSync(join(dest, "model.safetensors"), "x");
    const command = `${process.execPath} bin/orbax2reg.js export-hf ${step} ${dest}`;
    const r = await run("script", ["-qec", command, "/dev/null"], { timeout: 60_000 });
    expect(r.code, r.stdout).toBe(2);
    expect(r.stdout.trim()).toBe(
      `orbax2reg: ${dest}: holds files of another checkpoint (model.safetensors), not this export's; --force removes them`,
    );
  }, 90_000);

  test("an export that fails midway exits with its one error, its progress bar stopped", async () => {
    const { root, dest } = setup();
    const bad = join(root, "bad");
    writeRegularStep(bad, fujiArrays(DIMS, 5), (a) => [...a.shape]);
    writeFileSync(join(bad, "gda/model/decoder/output_norm/scale/0"), "not zstd");
    const command = `${process.execPath} bin/orbax2reg.js export-hf ${bad} ${dest}`;
    const r = await run("script", ["-qec", command, "/dev/null"], { timeout: 60_000 });
    expect(r.code, r.stdout).toBe(2);
    expect(r.stdout).toMatch(/orbax2reg: .*output_norm/);
  }, 90_000);
});

describe("verify of an export beside weights its index does not name", () => {
  test("fails naming a temporary file an interrupted write left (exit 4)", async () => {
    const { step, dest } = setup();
    expect((await exportHf(step, dest)).code).toBe(0);
    const left = abandoned("model-00002-of-00004.safetensors");
    writeFileSync(join(dest, left), "part of a shard");
    const r = await runCli(["verify", step, dest, "--no-progress"]);
    expect(r.code).toBe(4);
    expect(r.stdout).toContain(`FAIL ${left}: left by an interrupted write (export-hf removes it)`);
  });

  for (const [file, why] of [
    ["model.safetensors", "transformers loads it instead of the index"],
    ["pytorch_model.bin", "another checkpoint's"],
    ["model-00002-of-00002.safetensors", "another checkpoint's"],
  ] as const) {
    test(`fails naming ${file} (exit 4)`, async () => {
      const { step, dest } = setup();
      expect((await exportHf(step, dest)).code).toBe(0);
      writeFileSync(join(dest, file), "x");
      const r = await runCli(["verify", step, dest, "--no-progress"]);
      expect(r.code).toBe(4);
      expect(r.stdout).toContain(`FAIL ${file}: weights model.safetensors.index.json does not name: ${why}`);
    });
  }
});

/** Which of two safetensors files' embedding transformers loads from `dir`, as "a", "b" or "neither". */
const WHICH_LOADED = `
import sys, torch, transformers
from safetensors.torch import load_file
transformers.logging.set_verbosity_error()
model = transformers.LlamaForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
got = model.model.embed_tokens.weight.detach()
name = "model.embed_tokens.weight"
print(next((k for k, f in (("a", sys.argv[2]), ("b", sys.argv[3])) if torch.equal(load_file(f)[name].float(), got)), "neither"))
`;

describe.skipIf(!existsSync(HF_PYTHON))("transformers and another checkpoint's model.safetensors beside an export", () => {
  test("transformers loads a model.safetensors beside the index instead of the export; after --force, the export", async () => {
    const { root, step, dest } = setup();
    const other = join(root, "other");
    writeRegularStep(join(root, "other-step"), fujiArrays(DIMS, 5), (a) => [...a.shape]);
    expect((await exportHf(join(root, "other-step"), other)).code).toBe(0);
    expect((await exportHf(step, dest)).code).toBe(0);
    const shard = "model-00001-of-00001.safetensors";
    const which = async () => {
      const r = await run(HF_PYTHON, ["-c", WHICH_LOADED, dest, join(dest, shard), join(other, shard)]);
      expect(r.code, r.stderr).toBe(0);
      return r.stdout.trim();
    };
    expect(await which()).toBe("a");
    // The hazard: a transformers single-file checkpoint of another model dropped beside the export wins.
    copyFileSync(join(other, shard), join(dest, "model.safetensors"));
    expect(await which()).toBe("b");
    expect((await exportHf(step, dest)).code).toBe(2);
    expect((await exportHf(step, dest, "--force")).code).toBe(0);
    expect(await which()).toBe("a");
  }, 300_000);
});
