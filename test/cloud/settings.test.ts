import { describe, expect, test } from "vitest";
import { resolveCloudSettings } from "../../src/cloud/settings.js";
import { UsageError } from "../../src/errors.js";

const WF = "projects/p/locations/us-central1/workflows/orbax2reg-convert";
const none = () => undefined;

describe("where the `orbax2reg cloud` commands find the deployed pipeline", () => {
  test("a full --workflow id is used as given", () => {
    expect(resolveCloudSettings({ workflow: WF }, {}, none)).toEqual({ workflow: WF, eventsTopic: undefined });
  });

  test("--project and --region name the default workflow, orbax2reg-convert", () => {
    expect(resolveCloudSettings({ project: "p", region: "us-central1" }, {}, none).workflow).toBe(WF);
  });

  test("a workflow name with --project and --region makes a full id", () => {
    expect(resolveCloudSettings({ workflow: "conv", project: "p", region: "r" }, {}, none).workflow).toBe(
      "projects/p/locations/r/workflows/conv",
    );
  });

  test("flags win over the environment, which wins over terraform's outputs", () => {
    const env = { ORBAX2REG_WORKFLOW: "projects/e/locations/r/workflows/w", ORBAX2REG_EVENTS_TOPIC: "projects/e/topics/t" };
    const tf = () => ({ workflow_id: "projects/tf/locations/r/workflows/w", events_topic_id: "projects/tf/topics/t" });
    expect(resolveCloudSettings({ workflow: WF }, env, tf).workflow).toBe(WF);
    expect(resolveCloudSettings({}, env, tf)).toEqual({ workflow: env.ORBAX2REG_WORKFLOW, eventsTopic: env.ORBAX2REG_EVENTS_TOPIC });
    expect(resolveCloudSettings({}, {}, tf)).toEqual({
      workflow: "projects/tf/locations/r/workflows/w",
      eventsTopic: "projects/tf/topics/t",
    });
  });

  test("with nothing to go on, the error says every way to name the pipeline", () => {
    expect(() => resolveCloudSettings({}, {}, none)).toThrow(UsageError);
    expect(() => resolveCloudSettings({}, {}, none)).toThrow(
      /--workflow .* --project and --region .* ORBAX2REG_WORKFLOW.* terraform folder/,
    );
  });

  test("a bare workflow name without project and region is refused, naming what is missing", () => {
    expect(() => resolveCloudSettings({ workflow: "conv" }, {}, none)).toThrow(
      /"conv" is a name, not a full id: also give --project and --region/,
    );
  });
});
