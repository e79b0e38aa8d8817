import { beforeEach, describe, expect, test } from "vitest";
import type { ConversionEvent } from "../../../src/cloud/api/events.js";
import {
  type ExecutionRef,
  type ExecutionSummary,
  type Executions,
  executionLabels,
  type FindOptions,
  type WorkflowArgument,
} from "../../../src/cloud/api/executions.js";
import { jsonLogger } from "../../../src/cloud/api/log.js";
import { deliveryDeadlineMs } from "../../../src/cloud/trigger/config.js";
import { ClaimBusyError, DeadlineError, handleFinalized, type TriggerDeps } from "../../../src/cloud/trigger/handler.js";
import { startByHand } from "../../../src/cloud/trigger/start.js";
import { CLAIM_KEY, type ClaimRecord } from "../../../src/convert/work-dir.js";
import { ConflictError } from "../../../src/errors.js";
import { openStore } from "../../../src/store/open.js";
import { emulatorStorage, newBucket } from "../../helpers/gcs.js";

// Claims and the emergency "other half" check run against fake-gcs-server. The Workflows executions are an
// in-memory stand-in here, so each failure of the API can be placed exactly; the end-to-end test
// (test/e2e/pipeline.test.ts) drives the same crash points through the real function and the emulator.

const WORKFLOW = "projects/p/locations/l/workflows/orbax2reg-convert";
const LEASE_MS = 120_000;

interface Started {
  name: string;
  argument: WorkflowArgument;
  labels: Record<string, string>;
  /** When it was created; a QUEUED one has no startTime yet. */
  createTime: string;
  startTime?: string;
  state: string;
}

/** Executions in memory. `failNext`: the next start throws, before or after creating the execution. */
class FakeExecutions implements Executions {
  readonly started: Started[] = [];
  failNext: "before-create" | "after-create" | "invalid-argument" | undefined;
  /** Listing fails once an execution exists (the API went away right after the start call). */
  failFindAfterStart = false;
  /** Runs once, as the next listing answers (the caller is between claiming and starting). */
  onNextFind: (() => Promise<unknown>) | undefined;
  /** Runs once, right after the next start created its execution (before the caller hears of it). */
  onNextStart: (() => Promise<unknown>) | undefined;
  constructor(private readonly clock: () => number) {}
  async start(workflow: string, argument: WorkflowArgument, labels: Record<string, string>): Promise<string> {
    await new Promise((r) => setTimeout(r, 20)); // a round trip, so concurrent deliveries overlap
    const fail = this.failNext;
    this.failNext = undefined;
    if (fail === "before-create") throw new Error("503 Service Unavailable");
    if (fail === "invalid-argument") throw Object.assign(new Error("3 INVALID_ARGUMENT: invalid labels"), { code: 3 });
    const name = `${workflow}/executions/e${this.started.length + 1}`;
    const now = new Date(this.clock()).toISOString();
    this.started.push({ name, argument, labels, createTime: now, startTime: now, state: "ACTIVE" });
    const hook = this.onNextStart;
    this.onNextStart = undefined;
    await hook?.();
    if (fail === "after-create") throw new Error("4 DEADLINE_EXCEEDED: the connection dropped");
    return name;
  }
  /** As executions.list in its default BASIC view: name, state and times only, newest created first. */
  async find(workflow: string, labels: Record<string, string>, options: FindOptions = {}): Promise<ExecutionSummary[]> {
    return (await this.findFull(workflow, labels, options)).map(({ name, state, startTime }) => ({
      name,
      state,
      ...(startTime ? { startTime } : {}),
    }));
  }
  async findFull(_workflow: string, labels: Record<string, string>, options: FindOptions = {}): Promise<ExecutionRef[]> {
    if (this.failFindAfterStart && this.started.length > 0) throw new Error("503 Service Unavailable");
    const since = options.createdSince === undefined ? 0 : Date.parse(options.createdSince);
    const found = this.started
      .filter((e) => Object.entries(labels).every(([k, v]) => e.labels[k] === v) && !(Date.parse(e.createTime) < since))
      .sort((a, b) => b.createTime.localeCompare(a.createTime))
      .map((e) => full(e));
    // After the answer was made: the caller hears it only once the hook is done (it was stopped meanwhile).
    const hook = this.onNextFind;
    this.onNextFind = undefined;
    await hook?.();
    return found;
  }
  async get(name: string): Promise<ExecutionRef> {
    const e = this.started.find((x) => x.name === name);
    if (!e) throw new Error(`5 NOT_FOUND: ${name}`);
    return full(e);
  }
  async cancel(name: string): Promise<ExecutionSummary> {
    const e = this.started.find((x) => x.name === name);
    if (!e) throw new Error(`5 NOT_FOUND: ${name}`);
    e.state = "CANCELLED";
    return { name: e.name, state: e.state };
  }
}

const full = (e: Started): ExecutionRef => ({ ...e, argument: JSON.stringify(e.argument) });

const commit = (bucket: string, name = "runs/exp/step_00000100/commit_success.txt") => ({ id: "evt-1", data: { bucket, name } });
const claimKey = `step_00000100/${CLAIM_KEY}`;

describe("the trigger function's handler", () => {
  let bucket: string;
  let clock: number;
  let executions: FakeExecutions;
  let events: { topic: string; event: ConversionEvent }[];
  /** The handler's log lines, as the function writes them to Cloud Logging. */
  let lines: { severity: string; message: string }[] = [];
  const errorLines = () => lines.filter((l) => l.severity === "ERROR").map((l) => l.message);

  const deps = (): TriggerDeps => ({
    config: {
      workflow: WORKFLOW,
      rootPrefixes: ["runs"],
      destinationTemplate: `gs://${bucket}/{root}/regular`,
      groups: 4,
      eventsTopic: "projects/p/topics/orbax2reg-events",
      claimLeaseMs: LEASE_MS,
    },
    openStore,
    executions,
    async publish(topic, event) {
      events.push({ topic, event });
    },
    log: jsonLogger({}, (l) => lines.push(JSON.parse(l))),
    now: () => clock,
    // Waiting advances the test's clock instead of the wall clock.
    sleep: async (ms) => {
      clock += ms;
    },
    waitForPeerMs: 5_000,
  });

  const destination = async () => openStore(`gs://${bucket}/runs/exp/regular`);
  const readClaim = async (): Promise<ClaimRecord> => JSON.parse(new TextDecoder().decode(await (await destination()).read(claimKey)));
  /** A claim left by a delivery that died before it started anything, `ageMs` ago. */
  const deadClaim = async (ageMs: number) =>
    (await destination()).write(
      claimKey,
      new TextEncoder().encode(
        JSON.stringify({
          source: `gs://${bucket}/runs/exp/step_00000100`,
          step: 100,
          eventId: "dead",
          claimedAt: new Date(clock - ageMs).toISOString(),
          execution: null,
        }),
      ),
    );

  beforeEach(async () => {
    emulatorStorage();
    bucket = await newBucket("trig");
    clock = Date.parse("2026-11-30T12:00:00Z");
    executions = new FakeExecutions(() => clock);
    events = [];
  });

  /** `orbax2reg cloud start` of step 100, through the same claim. */
  const byHand = () =>
    startByHand(
      {
        argument: {
          source: `gs://${bucket}/runs/exp/step_00000100`,
          destination: `gs://${bucket}/runs/exp/regular`,
          step: 100,
          groups: 4,
        },
      },
      { ...deps(), workflow: WORKFLOW, claimLeaseMs: LEASE_MS },
    );

  test("by hand: a start while the step's execution runs is refused, naming it", async () => {
    await handleFinalized(commit(bucket), deps());
    await expect(byHand()).rejects.toThrow(ConflictError);
    await expect(byHand()).rejects.toThrow(`is being converted by ${WORKFLOW}/executions/e1`);
    expect(executions.started).toHaveLength(1);
  });

  test("by hand: after a run that ended (here cancelled a moment ago), a new execution starts instead of adopting the old one", async () => {
    await handleFinalized(commit(bucket), deps());
    await executions.cancel(`${WORKFLOW}/executions/e1`);
    expect(await byHand()).toEqual({ kind: "started", execution: `${WORKFLOW}/executions/e2` });
    expect(await readClaim()).toMatchObject({ execution: `${WORKFLOW}/executions/e2`, eventId: null });
  });

  test("the trigger, unlike a start by hand, adopts an execution that ended since its claim (a redelivery must not convert twice)", async () => {
    await deadClaim(0);
    const name = await executions.start(
      WORKFLOW,
      { source: "", destination: "", step: 100, groups: 4 },
      executionLabels(`gs://${bucket}/runs/exp/step_00000100`, 100),
    );
    await executions.cancel(name);
    clock += LEASE_MS + 1;
    expect(await handleFinalized(commit(bucket), deps())).toBe("adopted");
    expect(executions.started).toHaveLength(1);
  });

  test("a step's commit marker starts one execution with the documented argument, labelled with the step and its source root", async () => {
    expect(await handleFinalized(commit(bucket), deps())).toBe("started");
    expect(executions.started).toHaveLength(1);
    expect(executions.started[0]).toMatchObject({
      argument: { source: `gs://${bucket}/runs/exp/step_00000100`, destination: `gs://${bucket}/runs/exp/regular`, step: 100, groups: 4 },
      labels: { step: "100", source: expect.stringMatching(/^[0-9a-f]{16}$/) },
    });
  });

  test("two checkpoint roots in one bucket get different source labels for the same step", () => {
    const a = executionLabels("gs://b/runs/a/step_00000100", 100);
    const b = executionLabels("gs://b/runs/b/step_00000100", 100);
    expect(a.step).toBe(b.step);
    expect(a.source).not.toBe(b.source);
    expect(executionLabels("gs://b/runs/a/step_00000200", 200).source).toBe(a.source);
  });

  test("it publishes conversion.requested naming the execution", async () => {
    await handleFinalized(commit(bucket), deps());
    expect(events[0]?.topic).toBe("projects/p/topics/orbax2reg-events");
    expect(events[0]?.event).toMatchObject({ type: "conversion.requested", step: 100, execution: `${WORKFLOW}/executions/e1` });
  });

  test("the claim records the execution, so a redelivery knows the step is taken", async () => {
    await handleFinalized(commit(bucket), deps());
    expect(await readClaim()).toMatchObject({ step: 100, eventId: "evt-1", execution: `${WORKFLOW}/executions/e1` });
  });

  test("the same event delivered twice starts one execution", async () => {
    expect(await handleFinalized(commit(bucket), deps())).toBe("started");
    expect(await handleFinalized(commit(bucket), deps())).toBe("duplicate");
    expect(executions.started).toHaveLength(1);
  });

  test("with hf_export, a step asked for the export alone starts one execution, with its export and convert false, under duplicates", async () => {
    const exporting = (): TriggerDeps => {
      const d = deps();
      return {
        ...d,
        config: {
          ...d.config,
          convertEveryNSteps: 1000,
          export: { steps: [100], destinationTemplate: `gs://${bucket}/{root}/hf/{step}` },
          exportSettings: { dtype: "bfloat16", max_shard_size: "5GB", tasks: 4 },
        },
      };
    };
    expect(await handleFinalized(commit(bucket), exporting())).toBe("started");
    expect(await handleFinalized(commit(bucket), exporting())).toBe("duplicate");
    expect(executions.started).toHaveLength(1);
    expect(executions.started[0]?.argument).toEqual({
      source: `gs://${bucket}/runs/exp/step_00000100`,
      destination: `gs://${bucket}/runs/exp/regular`,
      step: 100,
      groups: 4,
      convert: false,
      export: { destination: `gs://${bucket}/runs/exp/hf/step_00000100`, dtype: "bfloat16", max_shard_size: "5GB", tasks: 4 },
    });
  });

  test("five deliveries at once start one execution, and the others wait for it and acknowledge", async () => {
    // Each delivery on its own clock (a shared one would spend the starter's deadline on the others' waits), and
    // each wait also takes real time, so the waiters' 5 s do not run out before the starter's requests answer.
    const ownClock = (): TriggerDeps => {
      let mine = clock;
      return {
        ...deps(),
        now: () => mine,
        sleep: async (ms) => {
          mine += ms;
          await new Promise((resolve) => setTimeout(resolve, ms / 5));
        },
      };
    };
    const outcomes = await Promise.all(Array.from({ length: 5 }, () => handleFinalized(commit(bucket), ownClock())));
    expect(outcomes.filter((o) => o === "started")).toHaveLength(1);
    expect(outcomes.filter((o) => o === "duplicate")).toHaveLength(4);
    expect(executions.started).toHaveLength(1);
  });

  test("chunk files, item markers and temporary directories start nothing and claim nothing", async () => {
    for (const name of [
      "runs/exp/step_00000100/state/d/00112233445566778899aabbccddeeff",
      "runs/exp/step_00000100/state/commit_success.txt",
      "runs/exp/step_00000100.orbax-checkpoint-tmp/commit_success.txt",
    ]) {
      expect(await handleFinalized(commit(bucket, name), deps())).toBe("ignored");
    }
    expect(executions.started).toHaveLength(0);
    const [files] = await emulatorStorage().bucket(bucket).getFiles();
    expect(files).toHaveLength(0);
  });

  test("with convert_every_n_steps, a step not divisible by it starts nothing, claims nothing and publishes nothing", async () => {
    const every = (): TriggerDeps => ({ ...deps(), config: { ...deps().config, convertEveryNSteps: 1000 } });
    expect(await handleFinalized(commit(bucket, "runs/exp/step_00000100/commit_success.txt"), every())).toBe("ignored");
    expect(executions.started).toHaveLength(0);
    expect(events).toHaveLength(0);
    const [files] = await emulatorStorage().bucket(bucket).getFiles();
    expect(files).toHaveLength(0);
    expect(await handleFinalized(commit(bucket, "runs/exp/step_00002000/commit_success.txt"), every())).toBe("started");
  });

  test("a malformed event is acknowledged, not retried, with one ERROR line each (the trigger-side alert sees drops)", async () => {
    lines = [];
    expect(await handleFinalized({ id: "x", data: { nope: 1 } }, deps())).toBe("ignored");
    expect(await handleFinalized({ id: "x" }, deps())).toBe("ignored");
    expect(errorLines()).toEqual([expect.stringMatching(/^malformed storage event dropped/), expect.stringMatching(/^malformed/)]);
  });

  test("an object that is not a commit marker is dismissed without a log line", async () => {
    lines = [];
    expect(await handleFinalized(commit(bucket, "runs/exp/regular/step_00000100/gda/w/0.0"), deps())).toBe("ignored");
    expect(lines).toEqual([]);
  });

  test("when starting fails and no execution exists, the claim is released and the error thrown for a redelivery", async () => {
    executions.failNext = "before-create";
    await expect(handleFinalized(commit(bucket), deps())).rejects.toThrow("503");
    expect(await (await destination()).stat(claimKey)).toBeUndefined();
    expect(await handleFinalized(commit(bucket), deps())).toBe("started");
    expect(executions.started).toHaveLength(1);
  });

  test("when Workflows refuses the request itself, the event is acknowledged (redelivery cannot help) and the claim released", async () => {
    executions.failNext = "invalid-argument";
    lines = [];
    expect(await handleFinalized(commit(bucket), deps())).toBe("refused");
    expect(errorLines()).toEqual([expect.stringMatching(/^the workflow refused to start: /)]);
    expect(await (await destination()).stat(claimKey)).toBeUndefined();
    expect(executions.started).toHaveLength(0);
  });

  test("when starting fails after the execution was created, that execution is kept and recorded, and no second one starts", async () => {
    executions.failNext = "after-create";
    expect(await handleFinalized(commit(bucket), deps())).toBe("started");
    expect(executions.started).toHaveLength(1);
    expect((await readClaim()).execution).toBe(`${WORKFLOW}/executions/e1`);
    expect(await handleFinalized(commit(bucket), deps())).toBe("duplicate");
    expect(executions.started).toHaveLength(1);
  });

  test("when starting and the lookup both fail, the claim is kept until its lease ends, then a redelivery finds the execution", async () => {
    executions.failNext = "after-create";
    executions.failFindAfterStart = true;
    await expect(handleFinalized(commit(bucket), deps())).rejects.toThrow("DEADLINE_EXCEEDED");
    executions.failFindAfterStart = false;
    expect((await readClaim()).execution).toBeNull();
    // A redelivery within the lease waits, then fails again for a later try.
    await expect(handleFinalized(commit(bucket), deps())).rejects.toThrow(ClaimBusyError);
    clock += LEASE_MS;
    expect(await handleFinalized(commit(bucket), deps())).toBe("adopted");
    expect(executions.started).toHaveLength(1);
    expect((await readClaim()).execution).toBe(`${WORKFLOW}/executions/e1`);
  });

  test("a claim whose delivery died before starting is not mistaken for a duplicate: a redelivery after its lease converts the step", async () => {
    await deadClaim(LEASE_MS + 1);
    expect(await handleFinalized(commit(bucket), deps())).toBe("started");
    expect(executions.started).toHaveLength(1);
    expect(await readClaim()).toMatchObject({ eventId: "evt-1", execution: `${WORKFLOW}/executions/e1` });
  });

  /** Another delivery's claim, written over this one's (a takeover), naming `execution` or none yet. */
  const takeOver = async (execution: string | null) =>
    (await destination()).write(
      claimKey,
      new TextEncoder().encode(
        JSON.stringify({
          source: `gs://${bucket}/runs/exp/step_00000100`,
          step: 100,
          eventId: "redelivery",
          claimedAt: new Date(clock).toISOString(),
          execution,
        }),
      ),
    );
  /** An execution started by the delivery that took the claim over. */
  const othersExecution = () => {
    const name = `${WORKFLOW}/executions/other`;
    const now = new Date(clock).toISOString();
    executions.started.push({
      name,
      argument: { source: "", destination: "", step: 100, groups: 4 },
      labels: executionLabels(`gs://${bucket}/runs/exp/step_00000100`, 100),
      createTime: now,
      startTime: now,
      state: "ACTIVE",
    });
    return name;
  };

  test("a delivery stopped between claiming and starting past its deadline starts nothing when it resumes, and gives its claim back", async () => {
    executions.onNextFind = async () => {
      clock += LEASE_MS; // SIGSTOP, then SIGCONT: the wall clock moved on
    };
    await expect(handleFinalized(commit(bucket), deps())).rejects.toThrow(DeadlineError);
    expect(executions.started).toHaveLength(0);
    expect(await (await destination()).stat(claimKey)).toBeUndefined();
    expect(await handleFinalized(commit(bucket), deps())).toBe("started");
  });

  test("the deadline is well before the function's timeout (the lease less 60 s, as terraform deploys it)", () => {
    expect(deliveryDeadlineMs(120_000)).toBe(45_000);
    expect(deliveryDeadlineMs(600_000)).toBe(405_000);
  });

  test("a delivery whose claim was taken over (and converted) while it was stopped starts nothing when it resumes", async () => {
    executions.onNextFind = async () => takeOver(othersExecution());
    expect(await handleFinalized(commit(bucket), deps())).toBe("duplicate");
    expect(executions.started.map((e) => e.name)).toEqual([`${WORKFLOW}/executions/other`]);
  });

  test("a delivery whose claim was taken over by one not started yet starts nothing, and fails for a later try", async () => {
    executions.onNextFind = async () => takeOver(null);
    await expect(handleFinalized(commit(bucket), deps())).rejects.toThrow(/taken over before this caller started/);
    expect(executions.started).toHaveLength(0);
  });

  test("when the claim was taken over during the start call and names another execution, this one's is cancelled", async () => {
    executions.onNextStart = async () => takeOver(othersExecution());
    expect(await handleFinalized(commit(bucket), deps())).toBe("duplicate");
    expect(executions.started.filter((e) => e.state === "ACTIVE").map((e) => e.name)).toEqual([`${WORKFLOW}/executions/other`]);
    expect((await readClaim()).execution).toBe(`${WORKFLOW}/executions/other`);
  });

  test("when the claim was taken over during the start call by one not started yet, this execution is recorded for both", async () => {
    executions.onNextStart = async () => takeOver(null);
    expect(await handleFinalized(commit(bucket), deps())).toBe("started");
    expect((await readClaim()).execution).toBe(`${WORKFLOW}/executions/e1`);
    expect(await handleFinalized(commit(bucket), deps())).toBe("duplicate");
    expect(executions.started).toHaveLength(1);
  });

  test("a fresh claim without an execution makes a redelivery fail for a later try, not acknowledge", async () => {
    await deadClaim(1_000);
    await expect(handleFinalized(commit(bucket), deps())).rejects.toThrow(/not started an execution yet; retry later/);
    expect(executions.started).toHaveLength(0);
  });

  test("an expired claim whose delivery started an execution before dying gets that execution recorded, not a second one", async () => {
    await deadClaim(LEASE_MS + 1);
    const labels = executionLabels(`gs://${bucket}/runs/exp/step_00000100`, 100);
    executions.started.push({
      name: `${WORKFLOW}/executions/orphan`,
      argument: { source: "", destination: "", step: 100, groups: 4 },
      labels,
      createTime: new Date(clock - LEASE_MS).toISOString(),
      startTime: new Date(clock - LEASE_MS).toISOString(),
      state: "ACTIVE",
    });
    expect(await handleFinalized(commit(bucket), deps())).toBe("adopted");
    expect(executions.started).toHaveLength(1);
    expect((await readClaim()).execution).toBe(`${WORKFLOW}/executions/orphan`);
  });

  test("an expired claim whose execution waits QUEUED in the backlog (created, no startTime yet) gets it recorded, not a second one", async () => {
    await deadClaim(LEASE_MS + 1);
    executions.started.push({
      name: `${WORKFLOW}/executions/backlogged`,
      argument: { source: "", destination: "", step: 100, groups: 4 },
      labels: executionLabels(`gs://${bucket}/runs/exp/step_00000100`, 100),
      createTime: new Date(clock - LEASE_MS).toISOString(),
      state: "QUEUED",
    });
    expect(await handleFinalized(commit(bucket), deps())).toBe("adopted");
    expect(executions.started).toHaveLength(1);
    expect((await readClaim()).execution).toBe(`${WORKFLOW}/executions/backlogged`);
  });

  test("an execution older than the claim (a run before the claim was deleted to convert again) does not stop a new one", async () => {
    executions.started.push({
      name: `${WORKFLOW}/executions/last-week`,
      argument: { source: "", destination: "", step: 100, groups: 4 },
      labels: executionLabels(`gs://${bucket}/runs/exp/step_00000100`, 100),
      createTime: new Date(clock - 7 * 86_400_000).toISOString(),
      startTime: new Date(clock - 7 * 86_400_000).toISOString(),
      state: "FAILED",
    });
    expect(await handleFinalized(commit(bucket), deps())).toBe("started");
    expect(executions.started).toHaveLength(2);
  });

  test("a failed conversion.requested publish does not fail the event: the conversion runs", async () => {
    const d = deps();
    expect(
      await handleFinalized(commit(bucket), {
        ...d,
        publish: async () => {
          throw new Error("pubsub down");
        },
      }),
    ).toBe("started");
  });

  test("an emergency step waits for its other half, then the second event starts it", async () => {
    const tensors = commit(bucket, "runs/em/tensors/step_00000200/commit_success.txt");
    expect(await handleFinalized(tensors, deps())).toBe("waiting");
    await emulatorStorage().bucket(bucket).file("runs/em/tensors/step_00000200/commit_success.txt").save("ok");
    await emulatorStorage().bucket(bucket).file("runs/em/non-tensors/step_00000200/index").save("[]");
    expect(await handleFinalized(commit(bucket, "runs/em/non-tensors/step_00000200/index"), deps())).toBe("started");
    expect(executions.started[0]?.argument.source).toBe(`gs://${bucket}/runs/em/tensors/step_00000200`);
  });
});
