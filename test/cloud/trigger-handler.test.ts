import { beforeEach, describe, expect, test } from "vitest";
import type { ConversionEvent } from "../../src/cloud/events.js";
import { jsonLogger } from "../../src/cloud/log.js";
import { handleFinalized, type TriggerDeps, type WorkflowArgument } from "../../src/cloud/trigger-handler.js";
import { CLAIM_KEY } from "../../src/convert/plan-format.js";
import { openStore } from "../../src/store/open.js";
import { emulatorStorage, newBucket } from "../helpers/gcs.js";

// Claims and the emergency "other half" check run against fake-gcs-server. Starting the workflow and
// publishing are recorded here; the end-to-end test drives the real emulators for those.
interface Recorded {
  executions: { workflow: string; argument: WorkflowArgument; labels: Record<string, string> }[];
  events: { topic: string; event: ConversionEvent }[];
}

function deps(bucket: string, recorded: Recorded, failStart = false): TriggerDeps {
  return {
    config: {
      workflow: "projects/p/locations/l/workflows/orbax2reg-convert",
      rootPrefixes: ["runs"],
      destinationTemplate: `gs://${bucket}/{root}/regular`,
      groups: 4,
      eventsTopic: "orbax2reg-events",
    },
    openStore,
    async startExecution(workflow, argument, labels) {
      if (failStart) throw new Error("503 Service Unavailable");
      recorded.executions.push({ workflow, argument, labels });
      return `${workflow}/executions/e${recorded.executions.length}`;
    },
    async publish(topic, event) {
      recorded.events.push({ topic, event });
    },
    log: jsonLogger({}, () => {}),
  };
}

const commit = (bucket: string, name = "runs/exp/step_00000100/commit_success.txt") => ({ id: "evt-1", data: { bucket, name } });

describe("the trigger function's handler", () => {
  let bucket: string;
  let recorded: Recorded;
  beforeEach(async () => {
    emulatorStorage();
    bucket = await newBucket("trig");
    recorded = { executions: [], events: [] };
  });

  test("a step's commit marker starts one execution with the documented argument and a step label", async () => {
    expect(await handleFinalized(commit(bucket), deps(bucket, recorded))).toBe("started");
    expect(recorded.executions).toEqual([
      {
        workflow: "projects/p/locations/l/workflows/orbax2reg-convert",
        argument: { source: `gs://${bucket}/runs/exp/step_00000100`, destination: `gs://${bucket}/runs/exp/regular`, step: 100, groups: 4 },
        labels: { step: "100" },
      },
    ]);
  });

  test("it publishes conversion.requested naming the execution", async () => {
    await handleFinalized(commit(bucket), deps(bucket, recorded));
    expect(recorded.events[0]?.topic).toBe("orbax2reg-events");
    expect(recorded.events[0]?.event).toMatchObject({
      type: "conversion.requested",
      step: 100,
      execution: expect.stringMatching(/executions\/e1$/),
    });
  });

  test("the claim object records the execution, so a re-run knows what ran", async () => {
    await handleFinalized(commit(bucket), deps(bucket, recorded));
    const store = await openStore(`gs://${bucket}/runs/exp/regular`);
    const claim = JSON.parse(new TextDecoder().decode(await store.read(`step_00000100/${CLAIM_KEY}`)));
    expect(claim).toMatchObject({ step: 100, execution: expect.stringMatching(/executions\/e1$/) });
  });

  test("the same event delivered twice starts one execution", async () => {
    expect(await handleFinalized(commit(bucket), deps(bucket, recorded))).toBe("started");
    expect(await handleFinalized(commit(bucket), deps(bucket, recorded))).toBe("duplicate");
    expect(recorded.executions).toHaveLength(1);
  });

  test("duplicate events arriving at once start one execution", async () => {
    const outcomes = await Promise.all(Array.from({ length: 5 }, () => handleFinalized(commit(bucket), deps(bucket, recorded))));
    expect(outcomes.filter((o) => o === "started")).toHaveLength(1);
    expect(recorded.executions).toHaveLength(1);
  });

  test("chunk files, item markers and temporary directories start nothing and claim nothing", async () => {
    for (const name of [
      "runs/exp/step_00000100/state/d/00112233445566778899aabbccddeeff",
      "runs/exp/step_00000100/state/commit_success.txt",
      "runs/exp/step_00000100.orbax-checkpoint-tmp/commit_success.txt",
    ]) {
      expect(await handleFinalized(commit(bucket, name), deps(bucket, recorded))).toBe("ignored");
    }
    expect(recorded.executions).toHaveLength(0);
    const [files] = await emulatorStorage().bucket(bucket).getFiles();
    expect(files).toHaveLength(0);
  });

  test("a malformed event is acknowledged, not retried", async () => {
    expect(await handleFinalized({ id: "x", data: { nope: 1 } }, deps(bucket, recorded))).toBe("ignored");
    expect(await handleFinalized({ id: "x" }, deps(bucket, recorded))).toBe("ignored");
  });

  test("when starting the workflow fails, the claim is released and the error thrown so the platform retries", async () => {
    await expect(handleFinalized(commit(bucket), deps(bucket, recorded, true))).rejects.toThrow("503");
    expect(await handleFinalized(commit(bucket), deps(bucket, recorded))).toBe("started");
  });

  test("an emergency step waits for its other half, then the second event starts it", async () => {
    const tensors = commit(bucket, "runs/em/tensors/step_00000200/commit_success.txt");
    expect(await handleFinalized(tensors, deps(bucket, recorded))).toBe("waiting");
    await emulatorStorage().bucket(bucket).file("runs/em/tensors/step_00000200/commit_success.txt").save("ok");
    await emulatorStorage().bucket(bucket).file("runs/em/non-tensors/step_00000200/index").save("[]");
    expect(await handleFinalized(commit(bucket, "runs/em/non-tensors/step_00000200/index"), deps(bucket, recorded))).toBe("started");
    expect(recorded.executions[0]?.argument.source).toBe(`gs://${bucket}/runs/em/tensors/step_00000200`);
  });
});
