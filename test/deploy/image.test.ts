import { spawn, spawnSync } from "node:child_process";
import { createHash, randomUUID } from "node:crypto";
import { chmodSync, existsSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, inject, test } from "vitest";
import { runJob } from "../../jobs/main.js";
import { jsonLogger } from "../../src/cloud/api/log.js";
import {
  type ExportBegun,
  type ProgressRecord,
  progressKey,
  RUN_EXPORT_KEY,
  RUN_PLAN_KEY,
  type RunPlan,
  runDirKey,
} from "../../src/convert/work-dir.js";
import { DEFAULT_EXPORT_MEMORY, exportHf } from "../../src/hf/export.js";
import { type FaultProxy, isDownload, startFaultProxy } from "../faults/proxy.js";
import { runBin } from "../helpers/cli.js";
import { fixtureCase } from "../helpers/convert.js";
import { downloadDir, emulatorStorage, newBucket, uploadDir } from "../helpers/gcs.js";
import { AXLEARN_FUJI_ROOT } from "../helpers/paths.js";
import { expectSameFiles } from "../helpers/same-files.js";
import { testTls } from "../helpers/tls.mjs";
import { tempDir } from "../helpers/tmp.js";

// The image, built from the Dockerfile, run two ways: as the CLI (its entry point: `docker run IMAGE convert
// ...`, as docs/install.md's "The container image" shows; those transcripts are not read here, this runs the same
// commands on its own fixture), and as Cloud Run runs the jobs: one container per task, as user `node` on a
// read-only root, the command and args jobs.tf gives (`node --max-semi-space-size=1 --initial-old-space-size=64`
// replacing the entry point, then `dist/jobs/main.js PHASE`: the conversion's phases, and the export job's), and the
// environment the workflow and Cloud Run give it, against fake-gcs-server on loopback (host network). Needs a
// container engine (ORBAX2REG_CONTAINER_ENGINE, default podman) that can run containers here, and the base image
// (ORBAX2REG_IMAGE_BASE, default the Dockerfile's node:22-bookworm-slim); skipped, saying why, without them.

const ENGINE = process.env.ORBAX2REG_CONTAINER_ENGINE || "podman";
const BASE = process.env.ORBAX2REG_IMAGE_BASE || "node:22-bookworm-slim";
/**
 * The image's tag, this checkout's own: every checkout on a machine shares the engine's image store, so one tag for
 * all would let two image tests at once (two worktrees, or CI beside a developer) run each other's image. Named by
 * a hash of the repository root (where vitest runs) rather than the process: a run killed before its clean-up
 * leaves at most one tag per checkout, which its next run takes over.
 */
const IMAGE = `localhost/orbax2reg:test-${createHash("sha256").update(process.cwd()).digest("hex").slice(0, 12)}`;

function unavailable(): string | undefined {
  const version = spawnSync(ENGINE, ["--version"], { encoding: "utf8" });
  if (version.error || version.status !== 0) return `no container engine ${JSON.stringify(ENGINE)} (ORBAX2REG_CONTAINER_ENGINE names one)`;
  if (spawnSync(ENGINE, ["image", "inspect", BASE], { encoding: "utf8" }).status !== 0)
    return `no base image ${BASE} here (ORBAX2REG_IMAGE_BASE names one)`;
  const run = spawnSync(ENGINE, ["run", "--rm", "--network", "host", BASE, "true"], { encoding: "utf8" });
  if (run.status !== 0) return `${ENGINE} cannot run a container here: ${run.stderr.trim().split("\n").at(-1)}`;
  return undefined;
}
const skipped = unavailable();
if (skipped !== undefined) process.stderr.write(`test/deploy/image.test.ts skipped: ${skipped}\n`);

const tiny = fixtureCase("tiny");
const WORKFLOW_EXECUTION = "projects/p1/locations/us-central1/workflows/orbax2reg-convert/executions/wf1";
/** What terraform gives every job (jobs.tf: job_location_env), and finalize in addition. */
const STATIC_ENV = { ORBAX2REG_PROJECT: "p1", ORBAX2REG_REGION: "us-central1" };
const FINALIZE_ENV = { ORBAX2REG_EVENTS_TOPIC: "projects/p1/topics/orbax2reg-events" };

type Env = Record<string, string>;
interface Ran {
  readonly code: number | null;
  readonly lines: Record<string, unknown>[];
  readonly stderr: string;
}

/** Where a task's container finds the test CA, mounted read-only: fake-gcs-server serves HTTPS with its certificate. */
const CONTAINER_CA = "/run/orbax2reg-test-ca.pem";

/** What jobs.tf runs in every job's container: its `command` (replacing the image's entry point), then `args`. */
const JOB_COMMAND = ["node", "--max-semi-space-size=1", "--initial-old-space-size=64"];
const jobArgs = (phase: string) => ["dist/jobs/main.js", phase];

/**
 * One task: a container of the image running jobs.tf's command for PHASE, as user node on a read-only root,
 * trusting the test CA (NODE_EXTRA_CA_CERTS, as a deployment behind a private CA would set it).
 */
function runTask(phase: string, env: Env, name = `orbax2reg-test-${randomUUID().slice(0, 8)}`): Promise<Ran> {
  const vars = Object.entries({ ...env, NODE_EXTRA_CA_CERTS: CONTAINER_CA }).flatMap(([k, v]) => ["--env", `${k}=${v}`]);
  const ca = ["--volume", `${testTls().caFile}:${CONTAINER_CA}:ro`];
  const [command, ...commandArgs] = JOB_COMMAND as [string, ...string[]];
  const args = ["run", "--rm", "--name", name, "--network", "host", "--user", "node", "--read-only", ...ca, ...vars];
  const child = spawn(ENGINE, [...args, "--entrypoint", command, IMAGE, ...commandArgs, ...jobArgs(phase)]);
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d) => {
    stdout += d;
  });
  child.stderr.on("data", (d) => {
    stderr += d;
  });
  return new Promise((resolve) =>
    child.on("close", (code) =>
      resolve({
        code,
        stderr,
        lines: stdout
          .split("\n")
          .filter((l) => l.startsWith("{"))
          .map((l) => JSON.parse(l)),
      }),
    ),
  );
}

/** A command's exit code and its output, both streams. */
function run(command: string, args: string[]): Promise<{ code: number | null; output: string }> {
  const child = spawn(command, args);
  let output = "";
  child.stdout.on("data", (d) => {
    output += d;
  });
  child.stderr.on("data", (d) => {
    output += d;
  });
  return new Promise((resolve) => child.on("close", (code) => resolve({ code, output })));
}

/** What Cloud Run sets in every task of a job execution (https://cloud.google.com/run/docs/container-contract#jobs-env-vars). */
const cloudRun = (job: string, index: number, count: number): Env => ({
  CLOUD_RUN_JOB: job,
  CLOUD_RUN_EXECUTION: `${job}-${randomUUID().slice(0, 5)}`,
  CLOUD_RUN_TASK_INDEX: String(index),
  CLOUD_RUN_TASK_COUNT: String(count),
  CLOUD_RUN_TASK_ATTEMPT: "0",
});

/** The workflow's own variables of a job execution (workflows/convert.yaml): its jobEnv, then the attempt id. */
const asEnv = (vars: readonly { name: string; value: string }[]): Env => Object.fromEntries(vars.map((v) => [v.name, v.value]));

describe.skipIf(skipped !== undefined)("the image", () => {
  let bucket: string;
  const endpoint = () => ({ ORBAX2REG_GCS_ENDPOINT: inject("gcsEndpoint") });
  const object = async (name: string) => {
    const file = emulatorStorage().bucket(bucket).file(name);
    return (await file.exists())[0] ? (await file.download())[0] : undefined;
  };

  beforeAll(async () => {
    // Niced: the machine's CPU is shared. Layers are cached, so an unchanged image builds in seconds. Not
    // spawnSync: the test worker must keep answering vitest while the build runs.
    // The commit the image reports comes from the context's build-info.json (.git is not sent).
    expect(spawnSync(process.execPath, ["scripts/build-info.mjs"]).status).toBe(0);
    const built = await run("nice", [ENGINE, "build", "--network", "host", "--build-arg", `NODE_IMAGE=${BASE}`, "-t", IMAGE, "."]);
    if (built.code !== 0) throw new Error(`${ENGINE} build failed:\n${built.output.slice(-4000)}`);
    bucket = await newBucket("image");
    await uploadDir(tiny.location, bucket, `runs/exp/${tiny.stepDir}`);
  }, 1_200_000);

  // Removes this checkout's tag (only the tag where another checkout's tag names the same image; the build stage's
  // cached layers stay, so the next build is quick). A failure is reported, not a failed suite: the tests have run.
  afterAll(async () => {
    const removed = await run(ENGINE, ["image", "rm", IMAGE]);
    if (removed.code !== 0) process.stderr.write(`test/deploy/image.test.ts: could not remove ${IMAGE}: ${removed.output.trim()}\n`);
  }, 60_000);

  describe("as the CLI (its entry point)", () => {
    /** `ENGINE run --rm [options] IMAGE ...args`: the image's entry point given the CLI's arguments. */
    const cli = (options: string[], args: string[]) => run(ENGINE, ["run", "--rm", "--read-only", ...options, IMAGE, ...args]);

    test("--version prints the version and the commit the image was built from, as the built CLI does", async () => {
      const r = await cli([], ["--version"]);
      expect(r.code, r.output).toBe(0);
      expect(r.output).toBe(runBin(["--version"]).stdout);
      expect(r.output).toMatch(/^orbax2reg \d+\.\d+\.\d+ \(commit /);
    });

    test("without arguments, and with --help, prints the usage and exits 0", async () => {
      for (const args of [[], ["--help"]]) {
        const r = await cli([], args);
        expect(r.code, r.output).toBe(0);
        expect(r.output).toMatch(/^Usage: orbax2reg \[options\] \[command\]/);
        expect(r.output).toMatch(/convert \[options\] <source> <dest-root>/);
      }
    });

    test("converts and verifies the bundled example on mounted folders, as an unprivileged user", async () => {
      const out = tempDir("image-cli");
      chmodSync(out, 0o777);
      const mounts = ["--user", "node", "--volume", `${resolve(dirname(tiny.location))}:/in:ro`, "--volume", `${out}:/out`];
      const converted = await cli(mounts, ["convert", `/in/${tiny.stepDir}`, "/out"]);
      expect(converted.code, converted.output).toBe(0);
      expect(converted.output).toMatch(new RegExp(`committed /out/${tiny.stepDir}/index`));
      const verified = await cli(mounts, ["verify", `/in/${tiny.stepDir}`, `/out/${tiny.stepDir}`]);
      expect(verified.code, verified.output).toBe(0);
      expect(verified.output).toMatch(/\b[1-9]\d* passed, 0 failed/);
      // And what it wrote passes the host's own verify.
      expect(runBin(["verify", tiny.location, `${out}/${tiny.stepDir}`]).code).toBe(0);
    });

    test("converts gs:// to gs:// (the CLI's dependencies are in the image)", async () => {
      const source = `gs://${bucket}/runs/exp/${tiny.stepDir}`;
      const destination = `gs://${bucket}/runs/cli/regular`;
      const env = ["--network", "host", "--env", `ORBAX2REG_GCS_ENDPOINT=${inject("gcsEndpoint")}`];
      const tls = ["--env", `NODE_EXTRA_CA_CERTS=${CONTAINER_CA}`, "--volume", `${testTls().caFile}:${CONTAINER_CA}:ro`];
      const converted = await cli([...env, ...tls], ["convert", source, destination]);
      expect(converted.code, converted.output).toBe(0);
      const verified = await cli([...env, ...tls], ["verify", source, `${destination}/${tiny.stepDir}`]);
      expect(verified.code, verified.output).toBe(0);
    });
  });

  test("plan, convert-group (2 groups × 2 tasks) and finalize, each a container, convert the step and verify passes", async () => {
    const source = `gs://${bucket}/runs/exp/${tiny.stepDir}`;
    const destination = `gs://${bucket}/runs/exp/regular`;
    // The plan job as workflows/convert.yaml starts it: the execution's argument as given.
    const plan = await runTask("plan", {
      ...STATIC_ENV,
      ...cloudRun("orbax2reg-plan", 0, 1),
      ...endpoint(),
      ORBAX2REG_ARGUMENT: JSON.stringify({ source, destination, groups: 2, tasks_per_group: 2 }),
      ORBAX2REG_GROUPS: "8",
      ORBAX2REG_RUN: `${destination}/${runDirKey("wf1")}`,
      ORBAX2REG_DESTINATION: destination,
      ORBAX2REG_EXECUTION: WORKFLOW_EXECUTION,
      ORBAX2REG_ATTEMPT: randomUUID(),
    });
    expect(plan.code, plan.stderr).toBe(0);
    const answer = JSON.parse(String(await object(`runs/exp/regular/${runDirKey("wf1")}${RUN_PLAN_KEY}`))) as RunPlan;
    expect(answer).toMatchObject({ groups: 2, tasksPerGroup: 2, committed: false });

    // Each group one job execution of tasksPerGroup tasks, run side by side as Cloud Run does.
    for (let group = 0; group < answer.groups; group++) {
      const attempt = randomUUID();
      const tasks = await Promise.all(
        Array.from({ length: answer.tasksPerGroup }, (_, task) =>
          runTask("convert-group", {
            ...STATIC_ENV,
            ...cloudRun("orbax2reg-convert-group", task, answer.tasksPerGroup),
            ...endpoint(),
            ...asEnv(answer.jobEnv),
            ORBAX2REG_GROUP: String(group),
            ORBAX2REG_ATTEMPT: attempt,
          }),
        ),
      );
      for (const t of tasks) expect(t.code, t.stderr).toBe(0);
    }

    const finalize = await runTask("finalize", {
      ...STATIC_ENV,
      ...FINALIZE_ENV,
      ...cloudRun("orbax2reg-finalize", 0, 1),
      ...endpoint(),
      ...asEnv(answer.jobEnv),
      ORBAX2REG_ATTEMPT: randomUUID(),
    });
    expect(finalize.code, finalize.stderr).toBe(0);
    expect(finalize.lines.at(-1)).toMatchObject({ severity: "INFO", message: "checkpoint committed", indexWritten: true });
    expect(await object(`runs/exp/regular/${tiny.stepDir}/index`)).toBeDefined();

    const verify = runBin(["verify", source, `${destination}/${tiny.stepDir}`]);
    expect(verify.code, verify.stderr).toBe(0);
    expect(verify.stdout).toMatch(/\b[1-9]\d* passed, 0 failed/);
  }, 600_000);

  // The bundled example plans 2 tasks (its 32k-token embedding is most of its bytes); a fuji step saved by AXLearn
  // (the global set-up makes it where .venv-axlearn is) spreads its weights over the layers and plans 4.
  const exportCases = [
    { name: "the bundled example", example: "test/fixtures/orbax-axlearn/fuji-v2-tiny/step_00001000", shard: 1000, tasks: 2, shards: 8 },
    {
      name: "a fuji step saved by AXLearn",
      example: `${AXLEARN_FUJI_ROOT}/grouped-untied/checkpoints/step_00001000`,
      shard: 50_000,
      tasks: 4,
      shards: 17,
    },
  ];
  for (const { name, example, shard, tasks, shards: shardCount } of exportCases)
    test.skipIf(!existsSync(example))(
      `export-begin, export-shards (${tasks} tasks) and export-finalize, each a container of the export job, export ${name}: export-hf's files byte for byte`,
      async () => {
        const exportBucket = await newBucket("image-export");
        await uploadDir(example, exportBucket, "runs/exp/step_00001000");
        const destination = `gs://${exportBucket}/runs/exp/regular`;
        const folder = "runs/exp/hf/step_00001000";
        const run = `${destination}/${runDirKey("wf1")}`;
        const argument = {
          source: `gs://${exportBucket}/runs/exp/step_00001000`,
          destination,
          convert: false,
          export: { destination: `gs://${exportBucket}/${folder}`, max_shard_size: shard, tasks: 4 },
        };
        // The plan job (in this process: its answer is all this needs) plans the export alone, as convert.yaml starts it.
        const planned = await runJob(
          "plan",
          {
            ORBAX2REG_ARGUMENT: JSON.stringify(argument),
            ORBAX2REG_DESTINATION: destination,
            ORBAX2REG_EXECUTION: WORKFLOW_EXECUTION,
            ORBAX2REG_RUN: run,
            ORBAX2REG_ATTEMPT: randomUUID(),
          },
          jsonLogger({}, () => {}),
        );
        expect(planned).toBe(0);
        const bucketObject = async (name: string) => (await emulatorStorage().bucket(exportBucket).file(name).download())[0];
        const answer = JSON.parse(String(await bucketObject(`runs/exp/regular/${runDirKey("wf1")}${RUN_PLAN_KEY}`))) as RunPlan;
        const exportEnv = { ...STATIC_ENV, ...endpoint(), ...asEnv(answer.export?.jobEnv ?? []) };
        // One job, its phase the execution's args override (jobs.tf: the export job), one container per task.
        const begin = await runTask("export-begin", {
          ...exportEnv,
          ...cloudRun("orbax2reg-export", 0, 1),
          ORBAX2REG_ATTEMPT: randomUUID(),
        });
        expect(begin.code, begin.stderr).toBe(0);
        const began = JSON.parse(String(await bucketObject(`runs/exp/regular/${runDirKey("wf1")}${RUN_EXPORT_KEY}`))) as ExportBegun;
        expect(began).toMatchObject({ tasks, shards: shardCount, alreadyExported: false });
        const attempt = randomUUID();
        const shards = await Promise.all(
          Array.from({ length: began.tasks }, (_, task) =>
            runTask("export-shards", { ...exportEnv, ...cloudRun("orbax2reg-export", task, began.tasks), ORBAX2REG_ATTEMPT: attempt }),
          ),
        );
        for (const t of shards) expect(t.code, t.stderr).toBe(0);
        const finalize = await runTask("export-finalize", {
          ...exportEnv,
          ...cloudRun("orbax2reg-export", 0, 1),
          ORBAX2REG_ATTEMPT: randomUUID(),
        });
        expect(finalize.code, finalize.stderr).toBe(0);
        expect(finalize.lines.find((l) => l.message === "export committed")).toMatchObject({ severity: "INFO", shards: shardCount });

        const want = tempDir("image-export");
        await exportHf(example, want, { memoryBytes: DEFAULT_EXPORT_MEMORY, maxShardSize: shard });
        expectSameFiles(await downloadDir(exportBucket, folder, tempDir("image-export-got")), want);
      },
      600_000,
    );

  describe("stopped", () => {
    let proxy: FaultProxy | undefined;
    afterAll(() => proxy?.close());

    test("as PID 1 of its container, a convert-group task exits 143 on SIGTERM with its record marked stopped", async () => {
      const destination = `gs://${bucket}/runs/exp/stopped`;
      const env = {
        ORBAX2REG_SOURCE: `gs://${bucket}/runs/exp/${tiny.stepDir}`,
        ORBAX2REG_DESTINATION: destination,
        ORBAX2REG_STEP: "100",
      };
      expect(
        await runJob(
          "plan",
          env,
          jsonLogger({}, () => {}),
        ),
      ).toBe(0);
      // The source's reads are held: the task is caught mid-conversion.
      const fromSource = (method: string, url: string) => isDownload(method, url) && url.includes(`/runs%2Fexp%2F${tiny.stepDir}%2F`);
      proxy = await startFaultProxy({ upstream: inject("gcsEndpoint"), rules: [{ match: fromSource, fault: "stall-headers" }] });
      const name = `orbax2reg-test-${randomUUID().slice(0, 8)}`;
      const task = runTask(
        "convert-group",
        { ...STATIC_ENV, ...cloudRun("orbax2reg-convert-group", 0, 1), ...env, ORBAX2REG_GROUP: "0", ORBAX2REG_GCS_ENDPOINT: proxy.url },
        name,
      );
      while (!proxy.log.some((r) => fromSource(r.method, r.url))) await new Promise((r) => setTimeout(r, 50));
      expect(spawnSync(ENGINE, ["kill", "--signal", "TERM", name]).status).toBe(0);
      const ran = await task;
      expect(ran.code).toBe(143);
      expect(ran.lines.filter((l) => l.severity !== "INFO").map((l) => l.message)).toEqual([expect.stringMatching(/^stopping \(SIGTERM/)]);
      const record = JSON.parse(String(await object(`runs/exp/stopped/${tiny.stepDir}/${progressKey("convert-group", 0, 0)}`)));
      expect(record as ProgressRecord).toMatchObject({ state: "stopped" });
    }, 120_000);
  });
});
