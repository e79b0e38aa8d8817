// googleapis.run.v2.projects.locations.jobs.run stand-in: "runs" the job locally and returns
// a Cloud Run Execution-like resource. Fault injection via env FAIL_GROUPS / FLAKY_GROUPS.
import { appendFileSync, existsSync, writeFileSync } from "node:fs";

let input = "";
for await (const c of process.stdin) input += c;
const { args } = JSON.parse(input);
const ov = args.body?.overrides ?? {};
const co = ov.containerOverrides?.[0] ?? {};
const group = co.args?.[co.args.indexOf("--group") + 1];
const log = process.env.RUN_JOB_LOG ?? "/tmp/wfemu-run-job.log";
const start = Date.now();
appendFileSync(log, `${JSON.stringify({ ev: "start", group, t: start, exec: process.env.GOOGLE_CLOUD_WORKFLOW_EXECUTION_ID })}\n`);
await new Promise((r) => setTimeout(r, Number(process.env.RUN_JOB_SLEEP_MS ?? 500)));
appendFileSync(log, `${JSON.stringify({ ev: "end", group, t: Date.now() })}\n`);
const flaky = (process.env.FLAKY_GROUPS ?? "").split(",").filter(Boolean);
if (flaky.includes(group)) {
  const marker = `/tmp/wfemu-flaky-${process.env.GOOGLE_CLOUD_WORKFLOW_EXECUTION_ID}-${group}`;
  if (!existsSync(marker)) {
    writeFileSync(marker, "1");
    console.log(JSON.stringify({ message: "connection reset (injected)", tags: ["ConnectionError"] }));
    process.exit(1);
  }
}
if ((process.env.FAIL_GROUPS ?? "").split(",").includes(group)) {
  console.log(
    JSON.stringify({
      message: `execution of ${args.name} failed: task 0 exited 1 (injected)`,
      tags: ["OperationError"],
      operation: { name: `${args.name}/executions/x`, done: true, error: { code: 2, message: "task failed" } },
    }),
  );
  process.exit(1);
}
const taskCount = ov.taskCount ?? 1;
console.log(
  JSON.stringify({
    name: `${args.name}/executions/${group}-${start}`,
    taskCount,
    succeededCount: taskCount,
    failedCount: 0,
    cancelledCount: 0,
    env: co.env ?? [],
    args: co.args ?? [],
  }),
);
