import { cancelMarkerKey } from "../../convert/work-dir.js";
import { CancelledError } from "../../errors.js";
import { describe, joinKey, type Store } from "../../store/store.js";

/**
 * The check the jobs make against the marker `orbax2reg cloud cancel` (src/cloud/ops/cancel.ts) leaves before
 * it cancels a workflow execution (its key: cancelMarkerKey, src/convert/work-dir.ts). It lives with the jobs so
 * the job image never loads operator code.
 */

/**
 * Throws CancelledError when the workflow execution a job belongs to was cancelled: jobs call it as they
 * start, and finalize right before it writes `index`.
 */
export async function stopIfCancelled(destination: Store, stepDir: string, workflowExecution: string | undefined): Promise<void> {
  if (!workflowExecution) return;
  const key = joinKey(stepDir, cancelMarkerKey(workflowExecution));
  if ((await destination.stat(key)) !== undefined) {
    throw new CancelledError(`the pipeline run ${workflowExecution} was cancelled; this job stops`, { path: describe(destination, key) });
  }
}
