import { cpSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { NotFoundError, UncommittedError } from "../../src/errors.js";
import { arraySha256, listArrays, readArray, type StoredArray } from "../../src/orbax/arrays.js";
import { chooseStepIn, listSteps, openStep, openStepIn, requireCommitted, stepDirName, TRACKER_FILE } from "../../src/orbax/step.js";
import { CountingStore } from "../../src/store/counting.js";
import { LocalStore } from "../../src/store/local.js";
import { newBucket, uploadDir } from "../helpers/gcs.js";
import { FIXTURES, GENERATED, UPSTREAM, UPSTREAM_NON_CRITICAL } from "../helpers/paths.js";
import { rootWithSteps, tempDir } from "../helpers/tmp.js";

const TINY = `${FIXTURES}/orbax-axlearn/tiny/step_00000100`;

async function arrays(location: string): Promise<StoredArray[]> {
  const out: StoredArray[] = [];
  for await (const a of listArrays(await openStep(location))) out.push(a);
  return out;
}

/** Decoded int32 values of an array (the upstream fixtures hold known small integers). */
async function int32Values(location: string, path: string): Promise<number[]> {
  const step = await openStep(location);
  for await (const a of listArrays(step)) {
    if (a.leaf.path !== path) continue;
    const values: number[] = [];
    for await (const slab of readArray(step, a)) values.push(...new Int32Array(slab.buffer, slab.byteOffset, slab.length / 4));
    return values;
  }
  throw new Error(`no array ${path}`);
}

describe("an AXLearn OrbaxCheckpointer step", () => {
  test("is recognised with its index item, commit marker and step number", async () => {
    const step = await openStep(TINY);
    expect(step.layout).toBe("axlearn");
    expect(step.step).toBe(100);
    expect(step.commit).toEqual({ committed: true, marker: "commit_success.txt" });
    expect(step.indexKey).toBe("index/index");
    expect(step.itemDir).toBe("state");
  });

  test("is opened from its listing: nothing is stat'ed, and iterator directories it does not have are not listed", async () => {
    const store = new CountingStore(new LocalStore(TINY));
    const step = await openStepIn(store, "step_00000100");
    expect(step.commit).toEqual({ committed: true, marker: "commit_success.txt" });
    expect(store.counts.stats).toBe(0); // index/index is read whole (the plan needs it), not stat'ed
    expect(step.indexBytes?.length).toBeGreaterThan(0);
    expect(store.counts.lists).toBe(3); // the step, its state item and state/array_metadatas/
  });

  test("lists its leaves in _METADATA (jax flatten) order with names and paths from the key tuple", async () => {
    const step = await openStep(TINY);
    const count = step.leaves.find((l) => l.path === "learner/optimizer/0/count");
    expect(count?.name).toBe("learner.optimizer.0.count");
    expect(count?.keys.map((k) => k.type)).toEqual(["dict", "dict", "sequence", "dict"]);
    expect(step.leaves[0]?.path).toBe("learner/optimizer/0/count");
    expect(step.leaves.at(-1)?.path).toBe("prng_key");
  });

  test("iterator files written beside the state are found", async () => {
    const step = await openStep(`${GENERATED}/iterators/step_00000100`);
    expect(step.iteratorFiles.map((f) => f.key)).toEqual(["python/python_0/input_iter"]);
    expect(step.leaves.find((l) => l.path === "input_iter")?.valueType).toBe("PythonSavable");
    expect(step.leaves.find((l) => l.path === "input_iter")?.isArray).toBe(false);
  });

  test("a two-process save's merged root points into both per-process databases", async () => {
    const files = new Set<string>();
    for (const a of await arrays(`${GENERATED}/multiprocess/step_00000100`)) {
      for (const c of a.chunks.values()) if (c.value.kind === "file") files.add(c.value.key.split("/")[1] ?? "");
    }
    expect([...files].sort()).toEqual(["ocdbt.process_0", "ocdbt.process_1"]);
  });
});

describe("choosing a step under a checkpoint root", () => {
  test("the latest committed step is chosen, temporary directories are ignored", async () => {
    const root = rootWithSteps(TINY, ["step_00000100", "step_00000300", "step_00000400.orbax-checkpoint-tmp"]);
    const step = await openStep(root);
    expect(step.step).toBe(300);
    expect(step.stepDir).toBe("step_00000300");
  });

  test("--step picks a given step, and an unknown one names the steps that exist", async () => {
    const root = rootWithSteps(TINY, ["step_00000100", "step_00000300"]);
    expect((await openStep(root, { step: 100 })).step).toBe(100);
    await expect(openStep(root, { step: 7 })).rejects.toThrow(/no step 7 \(steps here: 100, 300\)/);
  });

  test("on GCS a step without commit_success.txt is uncommitted and never chosen as latest", async () => {
    const bucket = await newBucket("commit");
    await uploadDir(TINY, bucket, "run/step_00000100");
    await uploadDir(TINY, bucket, "run/step_00000200", (k) => k === "commit_success.txt");
    const latest = await openStep(`gs://${bucket}/run`);
    expect(latest.step).toBe(100);
    const partial = await openStep(`gs://${bucket}/run/step_00000200`);
    expect(partial.commit.committed).toBe(false);
    expect(() => requireCommitted(partial)).toThrow(UncommittedError);
  });

  test("locally, a step under its final name is committed even without commit_success.txt (orbax < 0.12.3)", async () => {
    const root = rootWithSteps(TINY, ["step_00000100"]);
    rmSync(join(root, "step_00000100", "commit_success.txt"));
    expect((await openStep(join(root, "step_00000100"))).commit).toEqual({ committed: true, marker: "final-name" });
  });

  test("a step directory still under its temporary name is uncommitted", async () => {
    const root = rootWithSteps(TINY, ["step_00000100.orbax-checkpoint-tmp-7"]);
    const step = await openStep(join(root, "step_00000100.orbax-checkpoint-tmp-7"));
    expect(step.commit.committed).toBe(false);
  });
});

/** A GCS-like view of a local root (no atomic renames: commit_success.txt decides), counting stats in flight. */
class MarkerCountingStore extends CountingStore {
  inFlight = 0;
  maxInFlight = 0;

  override get renamesAtomically(): boolean | undefined {
    return undefined;
  }

  override async stat(key: string) {
    this.maxInFlight = Math.max(this.maxInFlight, ++this.inFlight);
    try {
      await new Promise((resolve) => setTimeout(resolve, 2)); // a request's latency, so that checks overlap
      return await super.stat(key);
    } finally {
      this.inFlight--;
    }
  }
}

/** A root of empty step directories `steps`; those in `committed` hold commit_success.txt. */
function markerRoot(steps: number[], committed: number[], tracker?: string): string {
  const root = tempDir("steps");
  for (const n of steps) mkdirSync(join(root, stepDirName(n)));
  for (const n of committed) writeFileSync(join(root, stepDirName(n), "commit_success.txt"), "Checkpoint commit was successful");
  if (tracker !== undefined) writeFileSync(join(root, TRACKER_FILE), tracker);
  return root;
}

describe("choosing a step under a root by AXLearn's tracker file (latest_checkpointed_step.txt)", () => {
  test("a tracker naming a committed step is trusted: that step, with one commit marker checked", async () => {
    const store = new MarkerCountingStore(new LocalStore(markerRoot([100, 200, 300], [100, 200, 300], "200\n")));
    expect(await chooseStepIn(store)).toEqual({ name: "step_00000200", step: 200, chosenBy: "tracker" });
    expect(store.counts.stats).toBe(1);
    const root = rootWithSteps(TINY, ["step_00000100", "step_00000300"]);
    writeFileSync(join(root, TRACKER_FILE), "100");
    const step = await openStep(root);
    expect([step.step, step.chosen?.chosenBy]).toEqual([100, "tracker"]);
  });

  test("a tracker naming an uncommitted step falls back to the latest committed step, saying why", async () => {
    const store = new MarkerCountingStore(new LocalStore(markerRoot([100, 200, 300], [100, 200], "300")));
    expect(await chooseStepIn(store)).toEqual({
      name: "step_00000200",
      step: 200,
      chosenBy: "listing",
      note: `${TRACKER_FILE} names step 300, which is not committed (no commit_success.txt in the step directory)`,
    });
  });

  test("a tracker naming a missing step, or no step number, falls back to listing, saying why", async () => {
    const missing = await chooseStepIn(new LocalStore(markerRoot([100, 200], [100, 200], "900")));
    expect(missing).toMatchObject({
      step: 200,
      chosenBy: "listing",
      note: `${TRACKER_FILE} names step 900, but there is no step_00000900`,
    });
    const garbage = await chooseStepIn(new LocalStore(markerRoot([100, 200], [100, 200], "step 9")));
    expect(garbage).toMatchObject({ step: 200, chosenBy: "listing", note: `${TRACKER_FILE} does not hold a step number ("step 9")` });
  });

  test("without a tracker the latest committed step is found by listing", async () => {
    expect(await chooseStepIn(new LocalStore(markerRoot([100, 200, 300], [100, 300])))).toEqual({
      name: "step_00000300",
      step: 300,
      chosenBy: "listing",
    });
  });

  test("many steps: commit markers are checked newest first, at most 32 at once, and no further than the latest committed", async () => {
    const steps = Array.from({ length: 200 }, (_, i) => i + 1);
    const oldest = new MarkerCountingStore(new LocalStore(markerRoot(steps, [1])));
    expect(await chooseStepIn(oldest)).toMatchObject({ step: 1, chosenBy: "listing" });
    expect(oldest.counts.stats).toBe(200);
    expect(oldest.maxInFlight).toBeGreaterThan(1);
    expect(oldest.maxInFlight).toBeLessThanOrEqual(32);
    const newest = new MarkerCountingStore(new LocalStore(markerRoot(steps, [200])));
    expect(await chooseStepIn(newest)).toMatchObject({ step: 200 });
    expect(newest.counts.stats).toBeLessThanOrEqual(32);
  });

  test("listSteps checks every step's marker, at most 32 at once", async () => {
    const steps = Array.from({ length: 100 }, (_, i) => i + 1);
    const store = new MarkerCountingStore(new LocalStore(markerRoot(steps, [7])));
    const listed = await listSteps(store);
    expect(listed.map((s) => s.step)).toEqual(steps);
    expect(listed.filter((s) => s.commit.committed).map((s) => s.step)).toEqual([7]);
    expect(store.maxInFlight).toBeLessThanOrEqual(32);
  });
});

describe("AXLearn's emergency checkpointer layout", () => {
  const ROOT = `${GENERATED}/emergency`;

  test("opens from its root, with the index under non-tensors/", async () => {
    const step = await openStep(ROOT);
    expect(step.layout).toBe("emergency");
    expect(step.step).toBe(100);
    expect(step.itemDir).toBe("tensors/step_00000100/default");
    expect(step.indexKey).toBe("non-tensors/step_00000100/index");
    expect(step.commit.committed).toBe(true);
  });

  test("opens from tensors/step_X as well", async () => {
    expect((await openStep(`${ROOT}/tensors/step_00000100`)).layout).toBe("emergency");
  });

  test("a step whose non-tensors index is missing is not committed", async () => {
    const root = rootWithSteps(`${ROOT}/tensors/step_00000100`, ["tensors/step_00000100"]);
    await expect(openStep(root)).rejects.toThrow(NotFoundError);
    const step = await openStep(root, { step: 100 });
    expect(step.commit).toMatchObject({ committed: false, reason: "non-tensors/step_00000100/index is missing" });
  });
});

describe("Orbax's own compatibility checkpoints", () => {
  const HAS_METADATA = `${UPSTREAM}/checkpoint_metadata_present/pytree_checkpointable_has_metadata`;

  test("a composite checkpoint's PyTree item is found through _CHECKPOINT_METADATA", async () => {
    const step = await openStep(HAS_METADATA);
    expect(step.layout).toBe("composite");
    expect(step.itemDir).toBe("state");
    expect(step.leaves.map((l) => l.path)).toEqual(["a", "b/c"]);
  });

  test("array values decode to what the generator saved (a = 0..7, b.c = 1..3)", async () => {
    expect(await int32Values(HAS_METADATA, "a")).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(await int32Values(HAS_METADATA, "b/c")).toEqual([1, 2, 3]);
  });

  test.each(UPSTREAM_NON_CRITICAL)("non-critical alteration %s still reads", async (variant) => {
    expect(await int32Values(`${UPSTREAM}/${variant}`, "a")).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
  });

  test("without _CHECKPOINT_METADATA the state item is still found", async () => {
    expect(await int32Values(`${UPSTREAM}/checkpoint_metadata_missing/pytree_checkpointable_has_metadata`, "b/c")).toEqual([1, 2, 3]);
  });

  test("without _METADATA the arrays come from the stored keys, with a warning", async () => {
    const location = `${UPSTREAM}/checkpoint_metadata_present/pytree_checkpointable_missing_metadata`;
    const step = await openStep(location);
    expect(step.warnings.join("\n")).toMatch(/no .*_METADATA/);
    expect(step.leaves.map((l) => l.name)).toEqual(["a", "b.c"]);
    expect(await int32Values(location, "b/c")).toEqual([1, 2, 3]);
  });

  test("an unmerged item (root manifest.ocdbt deleted) reads the per-process databases, with a warning", async () => {
    const location = `${UPSTREAM}/critical_metadata_alterations/missing_pytree_data_file_manifest.ocdbt`;
    const step = await openStep(location);
    expect(step.source.kind).toBe("ocdbt-unmerged");
    expect(step.warnings.join("\n")).toMatch(/unmerged OCDBT item/);
    expect(await int32Values(location, "a")).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
  });

  test("a deleted root d/ directory is a NotFoundError naming the missing node file", async () => {
    const location = `${UPSTREAM}/critical_metadata_alterations/missing_pytree_data_dir_d`;
    await expect(arrays(location)).rejects.toThrow(NotFoundError);
    await expect(arrays(location)).rejects.toThrow(/missing_pytree_data_dir_d\/state\/d\/[0-9a-f]{32}: no such file/);
  });
});

describe("the non-OCDBT per-parameter directory layout", () => {
  test("reads arrays stored as <name>/.zarray plus chunk files", async () => {
    // Re-create the tiny step's keys as plain files, as Orbax writes with use_ocdbt=False.
    const source = await openStep(TINY);
    const dir = tempDir("legacy");
    cpSync(`${TINY}/state/_METADATA`, join(dir, "_METADATA"));
    for await (const e of source.source.list("")) {
      const path = join(dir, ...e.key.split("/"));
      mkdirSync(join(path, ".."), { recursive: true });
      writeFileSync(path, await source.source.read(e.value));
    }
    // _METADATA of an OCDBT save says use_ocdbt; a genuine legacy save would not.
    const meta = JSON.parse(readFileSync(join(dir, "_METADATA"), "utf8"));
    meta.use_ocdbt = false;
    writeFileSync(join(dir, "_METADATA"), JSON.stringify(meta));
    const legacy = await openStep(dir);
    expect(legacy.source.kind).toBe("directory");
    const want = new Map<string, string>();
    for await (const a of listArrays(source)) want.set(a.leaf.path, await arraySha256(source, a));
    for await (const a of listArrays(legacy)) expect(await arraySha256(legacy, a)).toBe(want.get(a.leaf.path));
  });
});

describe("locations that hold no checkpoint", () => {
  test("an empty directory is a NotFoundError", async () => {
    await expect(openStep(tempDir("empty"))).rejects.toThrow(/no Orbax checkpoint here/);
  });
});
