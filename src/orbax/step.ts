import { MetadataError, NotFoundError, UncommittedError } from "../errors.js";
import { OcdbtDatabase } from "../ocdbt/database.js";
import { openStore } from "../store/open.js";
import { describe, joinKey, type ObjectInfo, type Store } from "../store/store.js";
import { parseCheckpointMetadata, pytreeItems } from "./checkpoint-metadata.js";
import { DirectorySource, type KvSource, OcdbtSource, UnionSource } from "./kv-source.js";
import { type Leaf, makeLeaf, type PyTreeMetadata, parsePyTreeMetadata } from "./pytree-metadata.js";

/**
 * - axlearn: AXLearn's OrbaxCheckpointer step (`index/index` + `state/`, iterators in `tfds/`, `python/`).
 * - emergency: AXLearn's emergency checkpointer (`tensors/step_X/default/` + `non-tensors/step_X/index`).
 * - composite: any other Orbax composite step (a PyTree item beside other items).
 * - pytree: a PyTree item directory given directly.
 */
export type Layout = "axlearn" | "emergency" | "composite" | "pytree";

export type CommitMarker =
  /** `commit_success.txt` in the step directory (GCS always; local since orbax 0.12.3). */
  | "commit_success.txt"
  /** Local filesystem before orbax 0.12.3: the step directory was renamed to its final name. */
  | "final-name"
  | "none";

export interface CommitStatus {
  readonly committed: boolean;
  readonly marker: CommitMarker;
  /** Why a step counts as uncommitted, for messages. */
  readonly reason?: string;
}

export interface OrbaxStep {
  /** Store rooted at the location the step was opened from. */
  readonly store: Store;
  /** Key prefix of the step directory ("" when the location is the step itself). */
  readonly stepDir: string;
  readonly step: number | undefined;
  readonly layout: Layout;
  readonly commit: CommitStatus;
  /** Key prefix of the PyTree item holding the arrays. */
  readonly itemDir: string;
  /** Key of AXLearn's index JSON, when the layout has one. */
  readonly indexKey: string | undefined;
  readonly metadata: PyTreeMetadata | undefined;
  readonly leaves: readonly Leaf[];
  readonly source: KvSource;
  /** AXLearn's per-process iterator files (`tfds/tf_<pid>/...`, `python/python_<pid>/...`, emergency `tf_<pid>/...`). */
  readonly iteratorFiles: readonly ObjectInfo[];
  readonly warnings: readonly string[];
}

export interface OpenStepOptions {
  /** With a checkpoint root: this step instead of the latest committed one. */
  readonly step?: number;
}

const STEP_DIR = /^step_(\d+)$/;
/** In the name of a directory Orbax is still writing (or abandoned): never a committed step. */
export const TMP_MARK = ".orbax-checkpoint-tmp";

/** `step_%08d`: the step directory name AXLearn writes, for Orbax and regular checkpoints alike. */
export function stepDirName(step: number): string {
  return `step_${String(step).padStart(8, "0")}`;
}

export function parseStepName(name: string): number | undefined {
  const m = STEP_DIR.exec(name);
  return m ? Number(m[1]) : undefined;
}

/**
 * Opens an Orbax step from a location that is a step directory, a checkpoint root (latest committed step
 * or `step`), an emergency checkpointer root or its `tensors/step_X`, or a PyTree item directory.
 */
export async function openStep(location: string, options: OpenStepOptions = {}): Promise<OrbaxStep> {
  const trimmed = location.replace(/\/+$/, "");
  const emergency = /^(.*)\/tensors\/(step_\d+)$/.exec(trimmed);
  if (emergency) {
    return openEmergency(await openStore(emergency[1] as string), parseStepName(emergency[2] as string));
  }
  const store = await openStore(trimmed);
  const top = await store.listDir("");
  const fileNames = new Set(top.files.map((f) => f.key));
  const dirNames = new Set(top.dirs);
  const name = trimmed.slice(trimmed.lastIndexOf("/") + 1);

  if (dirNames.has("tensors")) return openEmergency(store, options.step);
  if (fileNames.has("_CHECKPOINT_METADATA") || fileNames.has("commit_success.txt") || dirNames.has("state") || dirNames.has("index")) {
    return openStepDir(store, "", name);
  }
  if (fileNames.has("_METADATA") || fileNames.has("manifest.ocdbt") || top.dirs.some((d) => d.startsWith("ocdbt.process_"))) {
    return openItem(store, "", { layout: "pytree", step: parseStepName(name), commit: { committed: true, marker: "none" } });
  }
  const steps = top.dirs.filter((d) => parseStepName(d) !== undefined);
  if (steps.length > 0) {
    const chosen = await chooseStep(store, "", options.step);
    return openStepDir(store, chosen, chosen);
  }
  throw new NotFoundError("no Orbax checkpoint here (expected a step directory, a root with step_* directories, or a PyTree item)", {
    path: store.url,
  });
}

/** Lists the steps under a checkpoint root with their commit status, oldest first. */
export async function listSteps(store: Store, root = ""): Promise<{ name: string; step: number; commit: CommitStatus }[]> {
  const { dirs } = await store.listDir(root);
  const out = [];
  for (const name of dirs) {
    const step = parseStepName(name);
    if (step === undefined) continue; // also skips *.orbax-checkpoint-tmp* directories
    out.push({ name, step, commit: await commitStatus(store, joinKey(root, name), name) });
  }
  return out.sort((a, b) => a.step - b.step);
}

async function chooseStep(store: Store, root: string, step: number | undefined): Promise<string> {
  const steps = await listSteps(store, root);
  if (step !== undefined) {
    const hit = steps.find((s) => s.step === step);
    if (hit === undefined)
      throw new NotFoundError(`no step ${step} (steps here: ${steps.map((s) => s.step).join(", ") || "none"})`, {
        path: describe(store, root),
      });
    return hit.name;
  }
  const committed = steps.filter((s) => s.commit.committed);
  const latest = committed[committed.length - 1];
  if (latest === undefined) throw new NotFoundError("no committed step under this root", { path: describe(store, root) });
  return latest.name;
}

async function commitStatus(store: Store, stepDir: string, name: string): Promise<CommitStatus> {
  if (name.includes(TMP_MARK))
    return { committed: false, marker: "none", reason: "temporary directory name (save in progress or abandoned)" };
  if (await store.stat(joinKey(stepDir, "commit_success.txt"))) return { committed: true, marker: "commit_success.txt" };
  // Before orbax 0.12.3, a local save commits by renaming the temporary directory; GCS has no rename.
  if (store.renamesAtomically === true) return { committed: true, marker: "final-name" };
  return { committed: false, marker: "none", reason: "no commit_success.txt in the step directory" };
}

async function openStepDir(store: Store, stepDir: string, name: string): Promise<OrbaxStep> {
  const commit = await commitStatus(store, stepDir, name);
  const listing = await store.listDir(stepDir);
  const dirs = new Set(listing.dirs);
  const metaKey = joinKey(stepDir, "_CHECKPOINT_METADATA");
  let items: string[] = [];
  if (listing.files.some((f) => f.key === metaKey)) {
    items = pytreeItems(parseCheckpointMetadata(await store.read(metaKey), describe(store, metaKey))).filter((i) => dirs.has(i));
  }
  if (items.length === 0) items = ["state", "default"].filter((i) => dirs.has(i));
  const step = parseStepName(name);
  const item = items[0];
  if (item === undefined) {
    // StandardCheckpointer writes the PyTree item's files directly into the step directory.
    return openItem(store, stepDir, { layout: "pytree", step, commit });
  }
  const axlearn = item === "state" && (await store.stat(joinKey(stepDir, "index/index"))) !== undefined;
  return openItem(store, joinKey(stepDir, item), {
    layout: axlearn ? "axlearn" : "composite",
    step,
    commit,
    stepDir,
    indexKey: axlearn ? joinKey(stepDir, "index/index") : undefined,
    iteratorPrefixes: axlearn ? [`${joinKey(stepDir, "tfds")}/`, `${joinKey(stepDir, "python")}/`] : [],
  });
}

async function openEmergency(store: Store, step: number | undefined): Promise<OrbaxStep> {
  const steps = await listSteps(store, "tensors");
  const withIndex = [];
  for (const s of steps) {
    const index = await store.stat(joinKey("non-tensors", s.name, "index"));
    withIndex.push({ ...s, hasIndex: index !== undefined });
  }
  const pick =
    step === undefined ? withIndex.filter((s) => s.commit.committed && s.hasIndex).pop() : withIndex.find((s) => s.step === step);
  if (pick === undefined) {
    const what =
      step === undefined ? "no step with both tensors/ committed and non-tensors/<step>/index" : `no step ${step} under tensors/`;
    throw new NotFoundError(what, { path: store.url });
  }
  const commit: CommitStatus = !pick.commit.committed
    ? pick.commit
    : pick.hasIndex
      ? pick.commit
      : { committed: false, marker: pick.commit.marker, reason: `non-tensors/${pick.name}/index is missing` };
  const stepDir = joinKey("tensors", pick.name);
  const nonTensors = joinKey("non-tensors", pick.name);
  return openItem(store, joinKey(stepDir, "default"), {
    layout: "emergency",
    step: pick.step,
    commit,
    stepDir,
    indexKey: joinKey(nonTensors, "index"),
    iteratorPrefixes: [`${nonTensors}/tf_`],
  });
}

interface ItemContext {
  layout: Layout;
  step: number | undefined;
  commit: CommitStatus;
  stepDir?: string;
  indexKey?: string | undefined;
  iteratorPrefixes?: string[];
}

async function openItem(store: Store, itemDir: string, ctx: ItemContext): Promise<OrbaxStep> {
  const warnings: string[] = [];
  const listing = await store.listDir(itemDir);
  const files = new Set(listing.files.map((f) => f.key));
  const processDirs = listing.dirs.filter((d) => /^ocdbt\.process_/.test(d));

  let source: KvSource;
  if (files.has(joinKey(itemDir, "manifest.ocdbt"))) {
    source = new OcdbtSource(await OcdbtDatabase.open(store, itemDir));
  } else if (processDirs.length > 0) {
    warnings.push(
      `unmerged OCDBT item: no ${describe(store, joinKey(itemDir, "manifest.ocdbt"))}; reading the union of ${processDirs.length} per-process database(s) (Orbax's finalize never ran)`,
    );
    const dbs = await Promise.all(processDirs.map((d) => OcdbtDatabase.open(store, joinKey(itemDir, d))));
    source = new UnionSource(dbs, describe(store, itemDir));
  } else {
    source = new DirectorySource(store, itemDir);
  }

  let metadata: PyTreeMetadata | undefined;
  let leaves: Leaf[];
  const metaKey = joinKey(itemDir, "_METADATA");
  if (files.has(metaKey)) {
    metadata = parsePyTreeMetadata(await store.read(metaKey), describe(store, metaKey));
    leaves = [...metadata.leaves];
  } else {
    warnings.push(`no ${describe(store, metaKey)}: array names come from the stored keys and paths from splitting them at "."`);
    leaves = await leavesFromKeys(source);
  }
  if (source.kind === "directory" && leaves.filter((l) => l.isArray).length > 0 && metadata?.useOcdbt === true) {
    throw new NotFoundError("_METADATA says use_ocdbt, but there is no manifest.ocdbt and no ocdbt.process_* directory", {
      path: describe(store, itemDir),
    });
  }
  if (leaves.length === 0) throw new MetadataError("the item holds no arrays and no _METADATA", { path: describe(store, itemDir) });

  const iteratorFiles: ObjectInfo[] = [];
  for (const prefix of ctx.iteratorPrefixes ?? []) for await (const f of store.list(prefix)) iteratorFiles.push(f);

  return {
    store,
    stepDir: ctx.stepDir ?? itemDir,
    step: ctx.step,
    layout: ctx.layout,
    commit: ctx.commit,
    itemDir,
    indexKey: ctx.indexKey,
    metadata,
    leaves,
    source,
    iteratorFiles,
    warnings,
  };
}

/** Without `_METADATA`, every `<name>/.zarray` or `<name>/zarr.json` key is an array leaf. */
async function leavesFromKeys(source: KvSource): Promise<Leaf[]> {
  const leaves: Leaf[] = [];
  for await (const e of source.list("")) {
    const m = /^(.+)\/(\.zarray|zarr\.json)$/.exec(e.key);
    if (m)
      leaves.push(
        makeLeaf(
          (m[1] as string).split(".").map((key) => ({ key, type: "dict" })),
          "jax.Array",
        ),
      );
  }
  return leaves;
}

export function requireCommitted(step: OrbaxStep): void {
  if (!step.commit.committed) {
    throw new UncommittedError(`step is not committed (${step.commit.reason ?? "no commit marker"})`, {
      path: describe(step.store, step.stepDir),
    });
  }
}
