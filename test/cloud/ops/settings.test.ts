import { describe, expect, test } from "vitest";
import { resolveCloudSettings } from "../../../src/cloud/ops/settings.js";
import { UsageError } from "../../../src/errors.js";

const WF = "projects/p/locations/us-central1/workflows/orbax2reg-convert";
const none = () => undefined;

describe("where the `orbax2reg cloud` commands find the deployed pipeline", () => {
  test("a full --workflow id is used as given", () => {
    expect(resolveCloudSettings({ workflow: WF }, {}, none)).toMatchObject({ workflow: WF, eventsTopic: undefined });
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
    expect(resolveCloudSettings({}, env, tf)).toMatchObject({ workflow: env.ORBAX2REG_WORKFLOW, eventsTopic: env.ORBAX2REG_EVENTS_TOPIC });
    expect(resolveCloudSettings({}, {}, tf)).toMatchObject({
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

  test("the destination template and groups come from flags, the environment, terraform's outputs, then the module's defaults", () => {
    const tf = () => ({ workflow_id: WF, destination_template: "gs://{bucket}/tf/{root}", groups: 4 });
    expect(resolveCloudSettings({}, {}, tf)).toMatchObject({ destinationTemplate: "gs://{bucket}/tf/{root}", groups: 4 });
    const env = { ORBAX2REG_DESTINATION_TEMPLATE: "gs://out/{root}", ORBAX2REG_GROUPS: "6" };
    expect(resolveCloudSettings({}, env, tf)).toMatchObject({ destinationTemplate: "gs://out/{root}", groups: 6 });
    expect(resolveCloudSettings({ destinationTemplate: "gs://flag/{root}", groups: 2 }, env, tf)).toMatchObject({
      destinationTemplate: "gs://flag/{root}",
      groups: 2,
    });
    expect(resolveCloudSettings({ workflow: WF }, {}, none)).toMatchObject({
      destinationTemplate: "gs://{bucket}/{root}/regular",
      groups: 8,
    });
  });

  test("hf_export's destination template comes from the function's environment name, then terraform's output; none when off", () => {
    const tf = () => ({ workflow_id: WF, hf_export_destination_template: "gs://{bucket}/{root}/hf/{step}" });
    expect(resolveCloudSettings({}, {}, tf).exportDestinationTemplate).toBe("gs://{bucket}/{root}/hf/{step}");
    const env = { ORBAX2REG_EXPORT_DESTINATION_TEMPLATE: "gs://exports/{root}/{step}" };
    expect(resolveCloudSettings({}, env, tf).exportDestinationTemplate).toBe("gs://exports/{root}/{step}");
    // terraform outputs null when hf_export is off.
    expect(resolveCloudSettings({}, {}, () => ({ workflow_id: WF, hf_export_destination_template: null })).exportDestinationTemplate).toBe(
      undefined,
    );
  });

  test("the claim lease is the deployed function's (the environment, then terraform's output), else the longest any has", () => {
    const tf = () => ({ workflow_id: WF, claim_lease_seconds: 120 });
    expect(resolveCloudSettings({}, {}, tf).claimLeaseSeconds).toBe(120);
    expect(resolveCloudSettings({}, { ORBAX2REG_CLAIM_LEASE_SECONDS: "300" }, tf).claimLeaseSeconds).toBe(300);
    expect(resolveCloudSettings({ workflow: WF }, {}, none).claimLeaseSeconds).toBe(600);
    expect(() => resolveCloudSettings({ workflow: WF }, { ORBAX2REG_CLAIM_LEASE_SECONDS: "2m" }, none)).toThrow(
      /claim lease must be a positive whole number of seconds, got "2m"/,
    );
  });

  test("groups that are not a positive whole number are refused, naming where they came from", () => {
    expect(() => resolveCloudSettings({ workflow: WF }, { ORBAX2REG_GROUPS: "0" }, none)).toThrow(
      /groups must be a positive whole number, got "0"/,
    );
  });
});
