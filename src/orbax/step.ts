import { MetadataError, NotFoundError, UncommittedError, UsageError } from "../errors.js";
import { OcdbtDatabase } from "../ocdbt/database.js";
import { parseIndex } from "../regular/index-file.js";
import { INPUT, openStore } from "../store/open.js";
import { type DirListing, describe, joinKey, type ObjectInfo, readIfPresent, type Store } from "../store/store.js";
import { allInOrder, mapLimited } from "../util/budget.js";
import { parseCheckpointMetadata, pytreeItems } from "./checkpoint-metadata.js";
import { DirectorySource, type KvSource, OcdbtSource, UnionSource } from "./kv-source.js";
import { relativeToStep, type StepProcesses, stepProcesses } from "./processes.js";
import { type Leaf, makeLeaf, type PyTreeMetadata, parsePyTreeMetadata } from "./pytree-metadata.js";
import { isStepNumber, parseStepName, parseTemporaryStepName, stepDirName, TMP_MARK } from "./step-name.js";

export { isStepNumber, parseStepName, parseTemporaryStepName, stepDirName, TMP_MARK };

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
  /** That index's bytes, when they were read as the step was opened (the plan takes them from here). */
  readonly indexBytes?: Uint8Array;
  readonly metadata: PyTreeMetadata | undefined;
  readonly leaves: readonly Leaf[];
  readonly source: KvSource;
  /** AXLearn's per-process iterator files (`tfds/tf_<pid>/...`, `python/python_<pid>/...`, emergency `tf_<pid>/...`). */
  readonly iteratorFiles: readonly ObjectInfo[];
  /** The processes that saved the step and each one's iterator files (processes.ts). */
  readonly processes: StepProcesses;
  readonly warnings: readonly string[];
  /** How the step was chosen, when the location was a checkpoint root. */
  readonly chosen?: RootStep;
}

/** How a step under a checkpoint root was chosen. */
export type StepChoice =
  /** The step asked for (`--step`). */
  | "given"
  /** The committed step AXLearn's tracker file names (TRACKER_FILE). */
  | "tracker"
  /** The latest committed step, found by listing the root's steps and checking their commit markers. */
  | "listing";

export interface RootStep {
  /** The step directory's name under the root. */
  readonly name: string;
  readonly step: number;
  readonly chosenBy: StepChoice;
  /** Why the tracker file, being there, was not used. */
  readonly note?: string;
}

export interface OpenStepOptions {
  /** With a checkpoint root: this step instead of the latest committed one. */
  readonly step?: number;
}

/**
 * AXLearn's OrbaxCheckpointer (with `read_latest_checkpoint_from_tracker_file`) writes the latest committed
 * step into this file in the checkpoint root after each commit, as `str(step)`, and on restart trusts it
 * when that step's directory (`step_%08d`) is committed, listing the root only otherwise: listing a root of
 * thousands of steps "can take > 10 minutes" (axlearn/common/checkpointer_orbax.py,
 * `_CheckpointManagerWithTrackerFile`). orbax2reg reads it the same way.
 */
export const TRACKER_FILE = "latest_checkpointed_step.txt";
/** Commit markers checked at once when a root is listed (each is a request on GCS). */
const COMMIT_CHECKS_AT_ONCE = 32;

/**
 * An item's directory among a step's `dirs`: its final name, else its temporary one (`state.orbax-checkpoint-tmp`
 * or older `state.orbax-checkpoint-tmp-<N>`): a save killed before Orbax's finalize renamed no item.
 */
function itemDirName(dirs: ReadonlySet<string>, item: string): string | undefined {
  if (dirs.has(item)) return item;
  const base = `${item}${TMP_MARK}`;
  const temporary = (d: string) => d === base || (d.startsWith(`${base}-`) && /^\d+$/.test(d.slice(base.length + 1)));
  let found: string | undefined;
  for (const d of dirs) if (temporary(d) && (found === undefined || d > found)) found = d;
  return found;
}

/**
 * Opens an Orbax step from a location that is a step directory, a checkpoint root (latest committed step
 * or `step`), an emergency checkpointer root or its `tensors/step_X`, or a PyTree item directory.
 */
export async function openStep(location: string, options: OpenStepOptions = {}): Promise<OrbaxStep> {
  const trimmed = location.replace(/\/+$/, "");
  const emergency = /^(.*)\/tensors\/(step_\d+)$/.exec(trimmed);
  if (emergency) {
    return openEmergency(await openStore(emergency[1] as string, INPUT), parseStepName(emergency[2] as string));
  }
  return openStepIn(await openStore(trimmed, INPUT), trimmed.slice(trimmed.lastIndexOf("/") + 1), options);
}

/** openStep for the location at the top of `store`, whose last path segment is `name`. */
export async function openStepIn(store: Store, name: string, options: OpenStepOptions = {}): Promise<OrbaxStep> {
  const top = await store.listDir("");
  switch (kindOf(top)) {
    case "emergency":
      return openEmergency(store, options.step);
    case "step": {
      const step = await openStepDir(store, "", name, top);
      // --step picks a step under a root; given with a step directory it can only agree with it. Not ignored:
      // a user who typed it expects that step converted.
      if (options.step !== undefined && step.step !== undefined && step.step !== options.step) {
        throw new UsageError(
          `is the directory of step ${step.step}, not of step ${options.step} (--step chooses a step under a checkpoint root)`,
          { path: store.url },
        );
      }
      return step;
    }
    case "item":
      return openItem(store, "", { layout: "pytree", step: parseStepName(name), commit: { committed: true, marker: "none" } });
    case "root": {
      const chosen = await chooseStep(store, "", top.dirs, options.step);
      return { ...(await openStepDir(store, chosen.name, chosen.name)), chosen };
    }
    default:
      if (top.absent) throw new NotFoundError("does not exist", { path: store.url });
      if (top.file) {
        throw new UsageError(
          "is a file, not a directory (expected an Orbax step directory, a root with step_* directories, or a PyTree item)",
          {
            path: store.url,
          },
        );
      }
      // AXLearn's regular step (src/regular): `index` and `gda/`, what convert writes.
      if (top.files.some((f) => f.key === "index") && top.dirs.includes("gda")) {
        throw new UsageError(
          "is an AXLearn regular checkpoint step (index and gda/), not an Orbax checkpoint: this command reads Orbax steps (verify and export-hf also take regular ones)",
          { path: store.url },
        );
      }
      throw new NotFoundError("no Orbax checkpoint here (expected a step directory, a root with step_* directories, or a PyTree item)", {
        path: store.url,
      });
  }
}

/** What a location's top-level listing says it is (see openStep). */
function kindOf(top: DirListing): "emergency" | "step" | "item" | "root" | undefined {
  const fileNames = new Set(top.files.map((f) => f.key));
  const dirNames = new Set(top.dirs);
  if (dirNames.has("tensors")) return "emergency";
  if (
    fileNames.has("_CHECKPOINT_METADATA") ||
    fileNames.has("commit_success.txt") ||
    itemDirName(dirNames, "state") !== undefined ||
    itemDirName(dirNames, "index") !== undefined
  ) {
    return "step";
  }
  if (fileNames.has("_METADATA") || fileNames.has("manifest.ocdbt") || top.dirs.some((d) => d.startsWith("ocdbt.process_"))) {
    return "item";
  }
  const isStep = (d: string) => parseStepName(d) !== undefined || parseTemporaryStepName(d) !== undefined;
  return top.dirs.some(isStep) ? "root" : undefined;
}

/**
 * When the top of `store` is a checkpoint root (step_* directories), the step openStep would open there and how
 * it was chosen; undefined for a step directory, an item or an emergency checkpointer's root. Costs what
 * openStep's choice costs: a listing of the root, the tracker file and a commit marker or a few.
 */
export async function chooseStepIn(store: Store, step?: number): Promise<RootStep | undefined> {
  const top = await store.listDir("");
  return kindOf(top) === "root" ? chooseStep(store, "", top.dirs, step) : undefined;
}

/** Lists the steps under a checkpoint root with their commit status, oldest first. */
export async function listSteps(store: Store, root = ""): Promise<{ name: string; step: number; commit: CommitStatus }[]> {
  const { dirs } = await store.listDir(root);
  const named = finalSteps(dirs).sort((a, b) => a.step - b.step);
  const commits = await mapLimited(named, COMMIT_CHECKS_AT_ONCE, (s) => commitStatus(store, joinKey(root, s.name), s.name));
  return named.map((s, i) => ({ ...s, commit: commits[i] as CommitStatus }));
}

/** The step directories among `dirs` under their final names (*.orbax-checkpoint-tmp* ones are not). */
function finalSteps(dirs: readonly string[]): { name: string; step: number }[] {
  const out: { name: string; step: number }[] = [];
  for (const name of dirs) {
    const step = parseStepName(name);
    if (step !== undefined) out.push({ name, step });
  }
  return out;
}

/** `steps` in a message: all of a few, the ends of many (a root may hold thousands). */
function stepsHere(steps: readonly number[]): string {
  if (steps.length === 0) return "none";
  if (steps.length <= 20) return steps.join(", ");
  return `${steps.slice(0, 5).join(", ")}, ... (${steps.length - 10} more), ${steps.slice(-5).join(", ")}`;
}

/**
 * The step to open under a checkpoint root whose subdirectories are `dirs`: `step` if given; else the one
 * AXLearn's tracker file names if that step is committed here; else the latest committed one, checking
 * commit markers newest first, COMMIT_CHECKS_AT_ONCE at a time.
 */
async function chooseStep(store: Store, root: string, dirs: readonly string[], step: number | undefined): Promise<RootStep> {
  const steps = finalSteps(dirs).sort((a, b) => a.step - b.step);
  if (step !== undefined) {
    // Under its final name, else under a temporary one (a save in progress or killed: uncommitted).
    let hit = steps.find((s) => s.step === step);
    for (const name of dirs)
      if (parseTemporaryStepName(name) === step && (hit === undefined || (hit.name.includes(TMP_MARK) && name > hit.name)))
        hit = { name, step };
    if (hit === undefined)
      throw new NotFoundError(`no step ${step} (steps here: ${stepsHere(steps.map((s) => s.step))})`, {
        path: describe(store, root),
      });
    return { name: hit.name, step, chosenBy: "given" };
  }
  const tracked = await readTracker(store, root);
  let note: string | undefined = tracked?.note;
  if (tracked?.step !== undefined) {
    const name = stepDirName(tracked.step);
    const commit = dirs.includes(name) ? await commitStatus(store, joinKey(root, name), name) : undefined;
    if (commit?.committed) return { name, step: tracked.step, chosenBy: "tracker" };
    note = `${TRACKER_FILE} names step ${tracked.step}, ${commit === undefined ? `but there is no ${name}` : `which is not committed (${commit.reason})`}`;
  }
  const newestFirst = steps.reverse();
  for (let i = 0; i < newestFirst.length; i += COMMIT_CHECKS_AT_ONCE) {
    const window = newestFirst.slice(i, i + COMMIT_CHECKS_AT_ONCE);
    const commits = await Promise.all(window.map((s) => commitStatus(store, joinKey(root, s.name), s.name)));
    const latest = window[commits.findIndex((c) => c.committed)];
    if (latest !== undefined) return { ...latest, chosenBy: "listing", ...(note === undefined ? {} : { note }) };
  }
  throw new NotFoundError(`no committed step under this root${note === undefined ? "" : ` (${note})`}`, { path: describe(store, root) });
}

/** The step AXLearn's tracker file names (Python's `int()` of its text), or why it names none; undefined when absent. */
async function readTracker(store: Store, root: string): Promise<{ step?: number; note?: string } | undefined> {
  const bytes = await readIfPresent(store, joinKey(root, TRACKER_FILE));
  if (bytes === undefined) return undefined;
  const text = new TextDecoder().decode(bytes);
  const m = /^\s*\+?(\d+)\s*$/.exec(text);
  const step = m ? Number(m[1]) : Number.NaN;
  if (!Number.isSafeInteger(step)) return { note: `${TRACKER_FILE} does not hold a step number (${JSON.stringify(text.slice(0, 40))})` };
  return { step };
}

async function commitStatus(store: Store, stepDir: string, name: string): Promise<CommitStatus> {
  if (name.includes(TMP_MARK)) return commitStatusListed(store, name, false);
  return commitStatusListed(store, name, (await store.stat(joinKey(stepDir, COMMIT_MARKER))) !== undefined);
}

/** Orbax's commit marker file in a step directory (orbax-checkpoint 0.12.3 and later; older local saves rename). */
const COMMIT_MARKER = "commit_success.txt";

/** A step directory's commit status, given its name and whether its commit marker is there. */
function commitStatusListed(store: Store, name: string, marked: boolean): CommitStatus {
  if (name.includes(TMP_MARK))
    return { committed: false, marker: "none", reason: "temporary directory name (save in progress or abandoned)" };
  if (marked) return { committed: true, marker: "commit_success.txt" };
  // Before orbax 0.12.3, a local save commits by renaming the temporary directory; GCS has no rename.
  if (store.renamesAtomically === true) return { committed: true, marker: "final-name" };
  return { committed: false, marker: "none", reason: "no commit_success.txt in the step directory" };
}

/**
 * Opens the step in `stepDir` (`listing`: its listing, if already made). Reads that do not depend on each other
 * go out together: against GCS each is a round trip of tens of ms, and they come before any array is copied.
 */
async function openStepDir(store: Store, stepDir: string, name: string, listed?: DirListing): Promise<OrbaxStep> {
  const listing = listed ?? (await store.listDir(stepDir));
  // The commit marker is a file of the step directory: its listing says whether it is there.
  const marked = listing.files.some((f) => f.key === joinKey(stepDir, COMMIT_MARKER));
  const commit = commitStatusListed(store, name, marked);
  const dirs = new Set(listing.dirs);
  const has = (item: string) => itemDirName(dirs, item) !== undefined;
  const metaKey = joinKey(stepDir, "_CHECKPOINT_METADATA");
  const indexDir = itemDirName(dirs, "index");
  const indexKey = indexDir === undefined ? undefined : joinKey(stepDir, indexDir, "index");
  // AXLearn's state item is listed together with the metadata that names it (used if it does).
  const stateDir = itemDirName(dirs, "state");
  const stateListing = stateDir === undefined ? undefined : store.listDir(joinKey(stepDir, stateDir));
  stateListing?.catch(() => undefined); // awaited below only if the state item is the one opened
  // AXLearn's index is read whole (a few KB per hundred arrays), not stat'ed: the plan needs its text anyway.
  const [meta, indexBytes] = await allInOrder<[Uint8Array | undefined, Uint8Array | undefined]>([
    listing.files.some((f) => f.key === metaKey) ? store.read(metaKey) : undefined,
    indexKey === undefined ? undefined : readIfPresent(store, indexKey),
  ]);
  let items: string[] = [];
  if (meta !== undefined) items = pytreeItems(parseCheckpointMetadata(meta, describe(store, metaKey))).filter(has);
  if (items.length === 0) items = ["state", "default"].filter(has);
  const item = items[0];
  if (item === undefined) {
    const own = new Set(listing.files.map((f) => f.key.slice(f.key.lastIndexOf("/") + 1)));
    if (
      indexDir !== undefined &&
      !own.has("_METADATA") &&
      !own.has("manifest.ocdbt") &&
      !listing.dirs.some((d) => d.startsWith("ocdbt.process_"))
    ) {
      // AXLearn's step (it has the index item) whose arrays are nowhere: say which item is missing.
      throw new NotFoundError(`no state item (state/ or state${TMP_MARK}/) beside ${indexDir}/: the step holds no arrays`, {
        path: describe(store, stepDir),
      });
    }
    // StandardCheckpointer writes the PyTree item's files directly into the step directory.
    return openItem(store, stepDir, { layout: "pytree", step: parseStepName(name) ?? parseTemporaryStepName(name), commit });
  }
  const axlearn = item === "state" && indexBytes !== undefined;
  // A directory whose name gives no step (copied elsewhere, say): AXLearn's index starts with it.
  let step = parseStepName(name) ?? parseTemporaryStepName(name);
  if (step === undefined && axlearn && indexKey !== undefined) {
    step = parseIndex(new TextDecoder().decode(indexBytes), describe(store, indexKey)).step;
  }
  const opened = itemDirName(dirs, item) as string;
  return openItem(store, joinKey(stepDir, opened), {
    layout: axlearn ? "axlearn" : "composite",
    step,
    commit,
    stepDir,
    ...(opened === stateDir && stateListing !== undefined ? { listing: stateListing } : {}),
    indexKey: axlearn ? indexKey : undefined,
    ...(axlearn ? { indexBytes } : {}),
    // Only the iterator directories the step's listing shows: no request for the others.
    iteratorPrefixes: axlearn ? ["tfds", "python"].filter((d) => dirs.has(d)).map((d) => `${joinKey(stepDir, d)}/`) : [],
  });
}

async function openEmergency(store: Store, step: number | undefined): Promise<OrbaxStep> {
  const steps = await listSteps(store, "tensors");
  const withIndex = await mapLimited(steps, COMMIT_CHECKS_AT_ONCE, async (s) => ({
    ...s,
    hasIndex: (await store.stat(joinKey("non-tensors", s.name, "index"))) !== undefined,
  }));
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
  indexBytes?: Uint8Array | undefined;
  iteratorPrefixes?: string[];
  /** The item directory's listing, if already asked for. */
  listing?: Promise<DirListing>;
}

/** Every object under `prefix`, in the listing's order. */
async function listAll(store: Store, prefix: string): Promise<ObjectInfo[]> {
  const found: ObjectInfo[] = [];
  for await (const f of store.list(prefix)) found.push(f);
  return found;
}

async function openItem(store: Store, itemDir: string, ctx: ItemContext): Promise<OrbaxStep> {
  const warnings: string[] = [];
  const listing = await (ctx.listing ?? store.listDir(itemDir));
  const files = new Set(listing.files.map((f) => f.key));
  const processDirs = listing.dirs.filter((d) => /^ocdbt\.process_/.test(d));
  const metaKey = joinKey(itemDir, "_METADATA");
  const stepDir = ctx.stepDir ?? itemDir;

  // The database, _METADATA, the iterators' files and array_metadatas/ are read together (one round trip each).
  const merged = files.has(joinKey(itemDir, "manifest.ocdbt"));
  const [source, metaBytes, iteratorFiles, arrayMetadatas] = await allInOrder<[KvSource, Uint8Array | undefined, ObjectInfo[], string[]]>([
    merged
      ? OcdbtDatabase.open(store, itemDir).then((db): KvSource => new OcdbtSource(db))
      : processDirs.length > 0
        ? Promise.all(processDirs.map((d) => OcdbtDatabase.open(store, joinKey(itemDir, d)))).then(
            (dbs): KvSource => new UnionSource(dbs, describe(store, itemDir)),
          )
        : new DirectorySource(store, itemDir),
    files.has(metaKey) ? store.read(metaKey) : undefined,
    allInOrder((ctx.iteratorPrefixes ?? []).map((prefix) => listAll(store, prefix))).then((lists) => lists.flat()),
    listing.dirs.includes("array_metadatas")
      ? store.listDir(joinKey(itemDir, "array_metadatas")).then((l) => l.files.map((f) => f.key.slice(f.key.lastIndexOf("/") + 1)))
      : [],
  ]);
  if (!merged && processDirs.length > 0) {
    warnings.push(
      `unmerged OCDBT item: no ${describe(store, joinKey(itemDir, "manifest.ocdbt"))}; reading the union of ${processDirs.length} per-process database(s) (Orbax's finalize never ran)`,
    );
  }

  let metadata: PyTreeMetadata | undefined;
  let leaves: Leaf[];
  if (metaBytes !== undefined) {
    metadata = parsePyTreeMetadata(metaBytes, describe(store, metaKey));
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

  const processes = stepProcesses(
    listing.dirs,
    arrayMetadatas,
    relativeToStep(iteratorFiles, ctx.layout === "emergency" ? "" : stepDir, ctx.layout),
  );

  return {
    store,
    stepDir,
    step: ctx.step,
    layout: ctx.layout,
    commit: ctx.commit,
    itemDir,
    indexKey: ctx.indexKey,
    ...(ctx.indexBytes === undefined ? {} : { indexBytes: ctx.indexBytes }),
    metadata,
    leaves,
    source,
    iteratorFiles,
    processes,
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
