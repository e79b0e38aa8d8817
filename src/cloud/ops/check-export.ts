import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DEFAULT_EXPORT_MEMORY, exportHf } from "../../hf/export.js";
import { stepDirName } from "../../orbax/step-name.js";
import type { Store } from "../../store/store.js";
import { type ExecutionRef, type Executions, executionLabels, type WorkflowArgument } from "../api/executions.js";
import { parseWorkflowArgument } from "../job/workflow-argument.js";
import { expand } from "../trigger/classify.js";

/**
 * `orbax2reg cloud check`'s export stages (src/cloud/ops/check.ts), with hf_export on: an export-only run
 * ("convert": false) of the bundled fuji example, the one `orbax2reg example fuji` prints, into the folder
 * hf_export's destination_template gives for it under the check's own root, compared byte for byte with the export
 * the same engine makes of the same example on this machine. The tiny Orbax step the conversion check uploads is not
 * a fuji model (export-hf refuses it), so the fuji step is uploaded beside it. It was saved without a step commit
 * marker and is uploaded as it is: no object of it is one the trigger acts on (src/cloud/trigger/classify.ts), so no
 * conversion starts for it; the export reads no marker.
 */

/** The fuji example's step, and the shard size and tasks the check asks for: several shards over two tasks. */
export const EXPORT_STEP = 1000;
export const EXPORT_MAX_SHARD_SIZE = 100_000;
export const EXPORT_TASKS = 2;
const DTYPE = "bfloat16";

export interface ExportCheckPlan {
  /** The uploaded fuji step, gs://BUCKET/<root>/step_00001000. */
  readonly source: string;
  /** The export's folder: hf_export's destination_template for the check's root. */
  readonly exportTo: string;
  /** The regular destination root the run's work directory goes in: destination_template for the check's root. */
  readonly destinationRoot: string;
  readonly argument: WorkflowArgument;
  readonly labels: Record<string, string>;
}

/** The export-only run's argument for the check's root (a path in `bucket`), as `cloud start --export --export-only` makes one. */
export function exportCheckPlan(bucket: string, root: string, destinationTemplate: string, exportTemplate: string): ExportCheckPlan {
  const step = stepDirName(EXPORT_STEP);
  const source = `gs://${bucket}/${root}/${step}`;
  const values = { bucket, root, step };
  const exportTo = expand(exportTemplate, values);
  const destinationRoot = expand(destinationTemplate, values);
  const argument: WorkflowArgument = {
    source,
    destination: destinationRoot,
    step: EXPORT_STEP,
    // Nothing is converted: the groups are not read.
    groups: 1,
    convert: false,
    export: { destination: exportTo, dtype: DTYPE, max_shard_size: EXPORT_MAX_SHARD_SIZE, tasks: EXPORT_TASKS },
  };
  // As the plan job will read it: a template that puts the export inside the source is refused here, before any run.
  parseWorkflowArgument(argument, 1);
  return { source, exportTo, destinationRoot, argument, labels: executionLabels(source, EXPORT_STEP) };
}

/** Uploads every file of the fuji example (`local`) to `remote`; their number. */
export async function uploadExample(local: Store, remote: Store): Promise<number> {
  const keys: string[] = [];
  for await (const f of local.list("")) keys.push(f.key);
  // Never a commit marker: it would start a conversion of the step.
  const uploaded = keys.filter((k) => k !== "commit_success.txt");
  await Promise.all(uploaded.map(async (k) => remote.write(k, await local.read(k))));
  return uploaded.length;
}

/** Starts the run (its labels as the trigger's: `cloud status` and `cloud cancel` find it) and returns it. */
export async function startExportRun(executions: Executions, workflow: string, plan: ExportCheckPlan): Promise<ExecutionRef> {
  return executions.get(await executions.start(workflow, plan.argument, plan.labels));
}

/**
 * Compares the export at `remote` with the one made here from `localExample` with the same options: the same file
 * names, each with the same bytes. Reads only those names at `remote` (the folder is the check's own: nothing else
 * was there). Returns the line to report, or throws naming the first difference.
 */
export async function compareWithLocalExport(
  localExample: string,
  remote: Store,
  openStore: (location: string) => Promise<Store>,
): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "orbax2reg-check-export-"));
  try {
    const result = await exportHf(localExample, dir, {
      memoryBytes: DEFAULT_EXPORT_MEMORY,
      maxShardSize: EXPORT_MAX_SHARD_SIZE,
      dtype: DTYPE,
    });
    const local = await openStore(dir);
    const want: string[] = [];
    for await (const f of local.list("")) want.push(f.key);
    const got: string[] = [];
    for await (const f of remote.list("")) got.push(f.key);
    const missing = want.filter((k) => !got.includes(k));
    const extra = got.filter((k) => !want.includes(k));
    if (missing.length > 0 || extra.length > 0)
      throw new Error(
        `${remote.url}: ${missing.length > 0 ? `missing ${missing.slice(0, 5).join(", ")}` : ""}${missing.length > 0 && extra.length > 0 ? "; " : ""}${extra.length > 0 ? `not written by export-hf ${extra.slice(0, 5).join(", ")}` : ""}`,
      );
    let bytes = 0;
    for (const k of want) {
      const [a, b] = await Promise.all([remote.read(k), local.read(k)]);
      if (Buffer.compare(a, b) !== 0)
        throw new Error(`${remote.url}/${k}: not the bytes export-hf writes here (${a.length} bytes, ${b.length} here)`);
      bytes += a.length;
    }
    return `${want.length} files (${result.shards.length} shards), ${bytes} bytes: byte for byte export-hf's of the same example`;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
