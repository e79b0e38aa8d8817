import { cpSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { runBin, runCli } from "../helpers/cli.js";
import { FIXTURES, GENERATED } from "../helpers/paths.js";
import { rootWithSteps, tempDir } from "../helpers/tmp.js";

const TINY = `${FIXTURES}/orbax-axlearn/tiny/step_00000100`;

describe("orbax2reg executable", () => {
  test("--help lists the commands and exits 0", () => {
    const r = runBin(["--help"]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/Usage: orbax2reg/);
    expect(r.stdout).toMatch(/inspect/);
    expect(r.stdout).toMatch(/ocdbt/);
  });

  test("bad input prints one line naming the file and exits 2", () => {
    const dir = tempDir("bad");
    cpSync(TINY, join(dir, "step_00000100"), { recursive: true });
    writeFileSync(join(dir, "step_00000100/state/_METADATA"), "{not json");
    const r = runBin(["inspect", join(dir, "step_00000100")]);
    expect(r.code).toBe(2);
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
    expect(r.stderr).toMatch(/step_00000100\/state\/_METADATA: not valid JSON/);
  });

  test("an unknown command is a usage error with exit code 2", () => {
    expect(runBin(["frobnicate"]).code).toBe(2);
  });
});

describe("orbax2reg inspect", () => {
  test("--json prints one object with step, commit status, layout and arrays", async () => {
    const r = await runCli(["inspect", TINY, "--json"]);
    expect(r.code).toBe(0);
    const report = JSON.parse(r.stdout);
    expect(Object.keys(report)).toEqual(["step", "committed", "layout", "processes", "arrays", "nonArrays"]);
    expect(report).toMatchObject({ step: 100, committed: true, layout: "axlearn" });
    expect(report.arrays.find((a: { path: string }) => a.path === "model/decoder/layer/ffn/weight")).toEqual({
      path: "model/decoder/layer/ffn/weight",
      name: "model.decoder.layer.ffn.weight",
      dtype: "float32",
      shape: [64, 64],
      chunkShape: [16, 32],
      chunks: 8,
      storedBytes: expect.any(Number),
      storage: "out-of-line",
    });
  });

  test("--checksums adds a sha256 per array", async () => {
    const r = await runCli(["inspect", TINY, "--json", "--checksums"]);
    const report = JSON.parse(r.stdout);
    expect(report.arrays.every((a: { sha256?: string }) => /^[0-9a-f]{64}$/.test(a.sha256 ?? ""))).toBe(true);
  });

  test("the table shows every array, totals, the step and its commit status", async () => {
    const r = await runCli(["inspect", TINY]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^path\s+dtype\s+shape\s+chunk shape\s+chunks\s+stored\s+storage$/m);
    expect(r.stdout).toMatch(/^model\/decoder\/layer\/linear\/weight\s+bfloat16\s+\(4, 8\)\s+\(1, 4\)\s+8\s+136 B\s+inline$/m);
    expect(r.stdout).toMatch(/^15 arrays, 66 chunks, /m);
    expect(r.stdout).toMatch(/step 100, layout axlearn, committed \(commit_success.txt\)/);
  });

  test("warnings go to stderr so --json output stays parseable", async () => {
    const upstream = `${FIXTURES}/orbax-upstream/composite_checkpoint/critical_metadata_alterations/missing_pytree_data_file_manifest.ocdbt`;
    const r = await runCli(["inspect", upstream, "--json"]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout).arrays).toHaveLength(2);
    expect(r.stderr).toMatch(/^warning: unmerged OCDBT item/m);
  });

  test("--step selects a step under a root", async () => {
    const r = await runCli(["inspect", `${GENERATED}/large`, "--step", "200", "--json"]);
    expect(JSON.parse(r.stdout).step).toBe(200);
    expect((await runCli(["inspect", `${GENERATED}/large`, "--step", "x"])).code).toBe(2);
  });
});

describe("orbax2reg ocdbt ls", () => {
  test("--json lists every key with size and value location", async () => {
    const r = await runCli(["ocdbt", "ls", `${FIXTURES}/ocdbt-neuroglancer/files_min_arity.ocdbt`, "--json"]);
    expect(r.code).toBe(0);
    const rows = JSON.parse(r.stdout);
    expect(rows.map((x: { key: string }) => x.key)).toEqual(["#", "a", "b", "baz/first", "baz/x", "baz/z", "c", "empty"]);
    expect(rows[1]).toEqual({ key: "a", size: 3, inline: false, file: "d/f6d9da936d3f6f58b667ca9d54a38667", offset: 0 });
    expect(rows[0]).toEqual({ key: "#", size: 0, inline: true, file: null, offset: null });
  });

  test("--prefix restricts the listing", async () => {
    const r = await runCli(["ocdbt", "ls", `${FIXTURES}/ocdbt-neuroglancer/files_high_arity.ocdbt`, "--prefix", "baz/"]);
    expect(r.stdout).toMatch(/^baz\/first\s+0\s+inline$/m);
    expect(r.stdout).toMatch(/^3 keys, generation 1, 1 nodes read$/m);
  });

  test("a directory without manifest.ocdbt is a clear error", async () => {
    const r = await runCli(["ocdbt", "ls", tempDir("nodb")]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/manifest\.ocdbt: no such file/);
  });
});

describe("orbax2reg convert of a checkpoint root", () => {
  test("says which step it chose and how: AXLearn's tracker file, or the latest committed by listing (also in --json)", async () => {
    const root = rootWithSteps(TINY, ["step_00000100"]);
    writeFileSync(join(root, "latest_checkpointed_step.txt"), "100");
    const tracked = await runCli(["convert", root, tempDir("dest"), "--json"]);
    expect(tracked.code).toBe(0);
    expect(JSON.parse(tracked.stdout)).toMatchObject({ step: 100, stepChosenBy: "tracker" });
    const text = await runCli(["convert", root, tempDir("dest"), "--dry-run"]);
    expect(text.stdout).toMatch(/^step 100 \(step_00000100\): named by the root's latest_checkpointed_step\.txt$/m);
    writeFileSync(join(root, "latest_checkpointed_step.txt"), "200");
    const listed = await runCli(["plan", root, tempDir("dest"), "--json"]);
    expect(JSON.parse(listed.stdout)).toMatchObject({
      step: 100,
      stepChosenBy: "listing",
      stepChoiceNote: "latest_checkpointed_step.txt names step 200, but there is no step_00000200",
    });
  });
});

describe("orbax2reg convert of a checkpoint root with --step", () => {
  test("says nothing of a choice (none in --json): the step was given", async () => {
    const root = rootWithSteps(TINY, ["step_00000100"]);
    const r = await runCli(["convert", root, tempDir("dest"), "--step", "100", "--json"]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ step: 100, committed: true });
    expect(JSON.parse(r.stdout)).not.toHaveProperty("stepChosenBy");
  });
});

describe("--step given with a step directory", () => {
  test("another step than the directory's is refused, naming both (not silently ignored), exit 2", async () => {
    const r = await runCli(["convert", TINY, tempDir("dest"), "--step", "200"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe(
      `orbax2reg: ${TINY}: is the directory of step 100, not of step 200 (--step chooses a step under a checkpoint root)\n`,
    );
  });

  test("the directory's own step is accepted", async () => {
    expect((await runCli(["inspect", TINY, "--step", "100", "--json"])).code).toBe(0);
  });
});
