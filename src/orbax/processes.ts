import type { ObjectInfo } from "../store/store.js";

/**
 * The processes that saved a step, from the step's own record of them: each process of a multi-process Orbax save
 * writes its own OCDBT database (`<item>/ocdbt.process_<i>/`) and its own array metadata
 * (`<item>/array_metadatas/process_<i>`), and AXLearn's iterator handlers write each process's input iterator
 * under its index: `tfds/tf_<i>/<name>.index|.data-*` (tf.data, `_TfIteratorHandler`) and
 * `python/python_<i>/<name>` (grain and other PythonSavables, `_PythonSavableHandler`); the emergency layout's
 * `non-tensors/step_X/tf_<i>/...`. A restore on N processes reads process i's files on process i
 * (checkpointer.py: `tf_{jax.process_index()}`, `python_{jax.process_index()}`), so every process must have the
 * same iterator files or the restore fails on the one that lacks them while the others wait for it.
 */
export interface StepProcesses {
  /** How many processes saved the step: one more than the largest process index any record names (at least 1). */
  readonly count: number;
  /** Process indices with their own OCDBT database (`ocdbt.process_<i>/`). */
  readonly databases: readonly number[];
  /** Process indices with their own array metadata (`array_metadatas/process_<i>`). */
  readonly arrayMetadatas: readonly number[];
  /** Each process's iterator files, by process index (0..count-1), as names relative to the step (sorted). */
  readonly iterators: readonly ProcessIterators[];
}

export interface ProcessIterators {
  readonly process: number;
  /** The keys of its iterator files relative to the step directory, e.g. `python/python_1/input_iter`. */
  readonly files: readonly string[];
}

/** An iterator file that some processes have and others do not. */
export interface MissingIterator {
  /** The process that lacks it. */
  readonly process: number;
  /** The key it would have (relative to the step directory), e.g. `tfds/tf_1/input_iter.index`. */
  readonly file: string;
}

/** `tfds/tf_<i>/`, `python/python_<i>/` or (emergency) `tf_<i>/` at the start of a key relative to the step. */
const ITERATOR_DIR = /^(?:(tfds)\/tf_|(python)\/python_|()tf_)(\d+)\/(.+)$/;

type IteratorKind = "tfds" | "python" | "tf" | "tf-nested";

/**
 * The process index and the process-independent name of an iterator file's key relative to the step. The
 * emergency layout's regular checkpointer nests `tf_<i>/tf_<i>/<path>` (see plan.ts): the name is `<path>`.
 */
export function iteratorOwner(rel: string): { process: number; kind: IteratorKind; name: string } | undefined {
  const m = ITERATOR_DIR.exec(rel);
  if (!m) return undefined;
  const process = Number(m[4]);
  const name = m[5] as string;
  if (m[1] === "tfds") return { process, kind: "tfds", name };
  if (m[2] === "python") return { process, kind: "python", name };
  const nested = `tf_${process}/`;
  return name.startsWith(nested) ? { process, kind: "tf-nested", name: name.slice(nested.length) } : { process, kind: "tf", name };
}

/** The key process `process` has for an iterator file of this kind and name (relative to the step). */
function keyFor(kind: IteratorKind, process: number, name: string): string {
  if (kind === "tfds") return `tfds/tf_${process}/${name}`;
  if (kind === "python") return `python/python_${process}/${name}`;
  return kind === "tf" ? `tf_${process}/${name}` : `tf_${process}/tf_${process}/${name}`;
}

/**
 * The step's processes from the item's directory listing (`dirs`: its subdirectories; `arrayMetadataFiles`: the
 * names under `array_metadatas/`) and its iterator files (`iteratorFiles`, keys relative to the step directory).
 */
export function stepProcesses(
  dirs: readonly string[],
  arrayMetadataFiles: readonly string[],
  iteratorKeys: readonly string[],
): StepProcesses {
  const indices = (names: readonly string[], pattern: RegExp) =>
    [...new Set(names.flatMap((n) => (pattern.exec(n) ? [Number(pattern.exec(n)?.[1])] : [])))].sort((a, b) => a - b);
  const databases = indices(dirs, /^ocdbt\.process_(\d+)$/);
  const arrayMetadatas = indices(arrayMetadataFiles, /^process_(\d+)$/);
  const owners = iteratorKeys.map((k) => ({ key: k, owner: iteratorOwner(k) }));
  const highest = Math.max(0, ...databases, ...arrayMetadatas, ...owners.map((o) => o.owner?.process ?? 0));
  const count = highest + 1;
  const iterators: ProcessIterators[] = Array.from({ length: count }, (_, process) => ({
    process,
    files: owners
      .filter((o) => o.owner?.process === process)
      .map((o) => o.key)
      .sort(),
  }));
  return { count, databases, arrayMetadatas, iterators };
}

/**
 * Every iterator file one process has and another lacks (by its process-independent name), in process order:
 * empty when every process has the same iterator files (or none has any).
 */
export function missingIterators(p: StepProcesses): MissingIterator[] {
  const names = new Map<string, { kind: IteratorKind; name: string }>();
  const has = p.iterators.map((it) => new Set(it.files.map((f) => iteratorId(f))));
  for (const it of p.iterators) {
    for (const f of it.files) {
      const o = iteratorOwner(f);
      if (o) names.set(iteratorId(f), { kind: o.kind, name: o.name });
    }
  }
  const missing: MissingIterator[] = [];
  for (const [process, own] of has.entries()) {
    for (const [id, n] of [...names].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
      if (!own.has(id)) missing.push({ process, file: keyFor(n.kind, process, n.name) });
    }
  }
  return missing;
}

/** An iterator file's identity across processes: its kind and its name. */
function iteratorId(rel: string): string {
  const o = iteratorOwner(rel);
  return o ? `${o.kind}/${o.name}` : rel;
}

/** The iterator files' keys relative to the step directory `stepDir` ("" when the step is the store's root). */
export function relativeToStep(files: readonly ObjectInfo[], stepDir: string, layout: string): string[] {
  const base = stepDir === "" ? "" : `${stepDir}/`;
  return files.map((f) => {
    if (layout === "emergency") return f.key.replace(/^non-tensors\/step_\d+\//, "");
    return f.key.startsWith(base) ? f.key.slice(base.length) : f.key;
  });
}
