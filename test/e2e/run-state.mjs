// The state of the stand-in Cloud Run job executions of the end-to-end tests, shared by the two processes that
// play Cloud Run: connector-hook.mjs (starts executions, runs their tasks, answers the Workflows connector)
// and run-api.mjs (answers the Run Admin API as `orbax2reg cloud status|cancel` call it). One JSON file per
// execution, <state dir>/<execution id>.json, replaced atomically (write a temporary file, rename):
//   execution, job, operation   full resource names
//   taskCount, tasks            per task {state: pending|running|succeeded|failed|cancelled}
//   createTime, completionTime  RFC 3339; completionTime once done
//   runnerPid                   the detached runner; it and its tasks form one process group
//   done, error | response      the operation's outcome
// (plus what the hook needs to run it: phase, group, destination, env, fault).
import { existsSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export const stateFile = (dir, id) => join(dir, `${id}.json`);

export function readState(dir, id) {
  return existsSync(stateFile(dir, id)) ? JSON.parse(readFileSync(stateFile(dir, id), "utf8")) : undefined;
}

export function writeState(dir, id, state) {
  const tmp = `${stateFile(dir, id)}.${process.pid}.tmp`;
  writeFileSync(tmp, JSON.stringify(state));
  renameSync(tmp, stateFile(dir, id));
}

/** The last segment of a resource name: an execution's or operation's id, the state file's name. */
export const idOf = (name) => name.split("/").at(-1);

/** Tasks by state. Without per-task state (a blocking run) the outcome says it: all succeeded, or all failed. */
export function taskCounts(s) {
  const counts = { running: 0, succeeded: 0, failed: 0, cancelled: 0 };
  if (Array.isArray(s.tasks)) {
    for (const t of s.tasks) if (t.state in counts) counts[t.state]++;
  } else if (s.done) {
    counts[s.error ? "failed" : "succeeded"] = s.taskCount;
  }
  return counts;
}

/**
 * The Run v2 Execution resource, in proto3 JSON as Google returns it: camelCase, zero counts left out
 * (https://cloud.google.com/run/docs/reference/rest/v2/projects.locations.jobs.executions#Execution).
 */
export function executionResource(s, counts = taskCounts(s)) {
  const [, project, , , , , , id] = s.execution.split("/");
  const filter = `resource.type="cloud_run_job" labels."run.googleapis.com/execution_name"="${id}"`;
  const nonZero = (field, n) => (n ? { [field]: n } : {});
  return {
    name: s.execution,
    job: s.job,
    taskCount: s.taskCount,
    ...nonZero("runningCount", counts.running ?? 0),
    ...nonZero("succeededCount", counts.succeeded),
    ...nonZero("failedCount", counts.failed),
    ...nonZero("cancelledCount", counts.cancelled),
    ...(s.createTime ? { createTime: s.createTime, startTime: s.createTime } : {}),
    ...(s.completionTime ? { completionTime: s.completionTime } : {}),
    logUri: `https://console.cloud.google.com/logs/viewer?project=${project}&advancedFilter=${encodeURIComponent(filter)}`,
  };
}

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/**
 * Cancels a running execution as Cloud Run does: its tasks stop at once, unfinished tasks count as
 * cancelled, the execution is done. Kills the runner and its tasks (one process group). Returns the new state.
 */
export async function killExecution(dir, id) {
  const s = readState(dir, id);
  // The runner writes its pid as it starts; give it a moment if the cancel comes first.
  let pid = s.runnerPid;
  for (let i = 0; pid === undefined && i < 50; i++) {
    await sleep(20);
    pid = readState(dir, id)?.runnerPid;
  }
  if (pid !== undefined) {
    try {
      process.kill(-pid, "SIGKILL"); // the runner and its tasks: one process group
    } catch {}
    while (alive(pid)) await sleep(20);
  }
  const now = readState(dir, id);
  const tasks = (now.tasks ?? Array.from({ length: now.taskCount }, () => ({ state: "pending" }))).map((t) =>
    t.state === "succeeded" || t.state === "failed" ? t : { ...t, state: "cancelled" },
  );
  const cancelled = {
    ...now,
    tasks,
    done: true,
    completionTime: new Date().toISOString(),
    error: { code: 1, message: `The execution ${s.execution} was cancelled` },
  };
  writeState(dir, id, cancelled);
  return cancelled;
}
