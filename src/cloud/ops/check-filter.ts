import type { Executions } from "../api/executions.js";

/**
 * Proves, against the real Workflows API, the executions.list filter the pipeline relies on: the trigger looks up a
 * step's executions by `labels.step="N" AND labels.source="H" AND createTime>="T"` (src/cloud/api/executions.ts,
 * labelFilter) before starting one, so a filter the API ignored or read differently would start a second
 * conversion, or adopt another step's. The Workflows emulator parses the same syntax, so only the real API's answer,
 * read here at check time, can show it.
 *
 * Given the execution the trigger started for the check's step (found by that filter), it asks again and checks
 * that the answer holds exactly executions carrying those labels, the check's among them; that a label value no
 * execution can have matches nothing (a filter dropped or ignored would return every execution); and that the
 * createTime term keeps the execution when the time is before it and drops it when after.
 */
export async function proveLabelFilter(
  executions: Executions,
  workflow: string,
  labels: Record<string, string>,
  execution: string,
  createTime: { before: string; after: string },
): Promise<string> {
  const filter = Object.entries(labels)
    .map(([k, v]) => `labels.${k}="${v}"`)
    .join(" AND ");
  const matched = await executions.findFull(workflow, labels);
  const names = matched.map((e) => e.name);
  if (!names.includes(execution)) throw new Error(`${filter} did not return ${execution}, the execution it found a moment ago`);
  const stray = matched.filter((e) => Object.entries(labels).some(([k, v]) => e.labels[k] !== v));
  if (stray.length > 0) {
    throw new Error(
      `${filter} also returned ${stray.length} execution(s) without those labels (e.g. ${stray[0]?.name} labels ${JSON.stringify(stray[0]?.labels)}): ` +
        "the API did not apply the filter as the trigger reads it; the trigger could start a second conversion",
    );
  }
  // A valid label value (lowercase letters, digits, '-') that no execution carries.
  const none = { ...labels, source: "orbax2reg-check-no-such-root" };
  const decoy = await executions.find(workflow, none);
  if (decoy.length > 0) {
    throw new Error(
      `labels.source="${none.source}" matched ${decoy.length} execution(s) (e.g. ${decoy[0]?.name}): the filter was not applied`,
    );
  }
  const since = await executions.find(workflow, labels, { createdSince: createTime.before });
  if (!since.some((e) => e.name === execution))
    throw new Error(`${filter} AND createTime>="${createTime.before}" did not return ${execution}`);
  const later = await executions.find(workflow, labels, { createdSince: createTime.after });
  if (later.some((e) => e.name === execution)) {
    throw new Error(
      `${filter} AND createTime>="${createTime.after}" still returned ${execution}, created before that: the createTime term was not applied`,
    );
  }
  return (
    `${filter} returned ${matched.length} execution(s), all with those labels, ${execution.replace(/^.*\//, "")} among them; ` +
    `a label value no execution has matched none; createTime>= before it kept it, after it dropped it`
  );
}
