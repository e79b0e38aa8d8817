import { describe, expect, test } from "vitest";
import { triggerConfigFromEnv } from "../../../src/cloud/trigger/config.js";
import { LONGEST_CLAIM_LEASE_SECONDS } from "../../../src/defaults.js";
import { ConfigError } from "../../../src/errors.js";

// The function's environment as terraform/modules/orbax2reg/function.tf sets it for the module's defaults.
const DEPLOYED = {
  ORBAX2REG_WORKFLOW: "projects/p/locations/us-central1/workflows/orbax2reg-convert",
  ORBAX2REG_ROOT_PREFIXES: "",
  ORBAX2REG_DESTINATION_TEMPLATE: "gs://{bucket}/{root}/regular",
  ORBAX2REG_EVENTS_TOPIC: "projects/p/topics/orbax2reg-events",
  ORBAX2REG_GROUPS: "8",
  ORBAX2REG_CLAIM_LEASE_SECONDS: "120",
  ORBAX2REG_CONVERT_EVERY_N_STEPS: "1",
};

const refused = (env: Record<string, string | undefined>) => {
  try {
    triggerConfigFromEnv(env);
  } catch (e) {
    if (e instanceof ConfigError) return e;
    throw e;
  }
  throw new Error("accepted");
};

describe("the trigger function's configuration", () => {
  test('an empty ORBAX2REG_ROOT_PREFIXES (checkpoint_prefixes = [""]) watches the whole bucket', () => {
    expect(triggerConfigFromEnv(DEPLOYED)).toMatchObject({ rootPrefixes: [""], groups: 8, claimLeaseMs: 120_000 });
  });

  test("ORBAX2REG_CONVERT_EVERY_N_STEPS is how often steps are converted; unset, every step", () => {
    expect(triggerConfigFromEnv({ ...DEPLOYED, ORBAX2REG_CONVERT_EVERY_N_STEPS: "1000" }).convertEveryNSteps).toBe(1000);
    expect(triggerConfigFromEnv({ ORBAX2REG_WORKFLOW: DEPLOYED.ORBAX2REG_WORKFLOW }).convertEveryNSteps).toBe(1);
  });

  test("a prefix list is split on commas and trimmed", () => {
    expect(triggerConfigFromEnv({ ...DEPLOYED, ORBAX2REG_ROOT_PREFIXES: "runs, exp/a" }).rootPrefixes).toEqual(["runs", "exp/a"]);
  });

  test("optional variables left unset take their documented defaults", () => {
    const c = triggerConfigFromEnv({ ORBAX2REG_WORKFLOW: DEPLOYED.ORBAX2REG_WORKFLOW });
    expect(c).toMatchObject({ rootPrefixes: [""], destinationTemplate: "gs://{bucket}/{root}/regular", groups: 8, eventsTopic: undefined });
    expect(c.claimLeaseMs).toBe(LONGEST_CLAIM_LEASE_SECONDS * 1000);
  });

  test.each([
    ["ORBAX2REG_WORKFLOW", undefined, /ORBAX2REG_WORKFLOW is not set: required/],
    ["ORBAX2REG_WORKFLOW", "orbax2reg-convert", /ORBAX2REG_WORKFLOW="orbax2reg-convert": must be a full workflow id/],
    ["ORBAX2REG_ROOT_PREFIXES", "gs://b/runs", /ORBAX2REG_ROOT_PREFIXES="gs:\/\/b\/runs": entries are paths inside the bucket/],
    ["ORBAX2REG_DESTINATION_TEMPLATE", "/local/regular", /ORBAX2REG_DESTINATION_TEMPLATE="\/local\/regular": must be a gs:\/\//],
    ["ORBAX2REG_DESTINATION_TEMPLATE", "gs://{bucket}/{run}", /placeholders are \{bucket\}, \{root\} and \{step\}/],
    ["ORBAX2REG_GROUPS", "0", /ORBAX2REG_GROUPS="0": must be an integer from 1 to 100/],
    ["ORBAX2REG_GROUPS", "eight", /ORBAX2REG_GROUPS="eight"/],
    ["ORBAX2REG_EVENTS_TOPIC", "orbax2reg-events", /must be a full topic id/],
    ["ORBAX2REG_CLAIM_LEASE_SECONDS", "5", /must be an integer from 60 to 3600/],
    ["ORBAX2REG_CONVERT_EVERY_N_STEPS", "0", /ORBAX2REG_CONVERT_EVERY_N_STEPS="0": must be an integer from 1 to/],
    ["ORBAX2REG_CONVERT_EVERY_N_STEPS", "every 100", /ORBAX2REG_CONVERT_EVERY_N_STEPS="every 100"/],
  ])("%s=%s is refused with a message naming the variable and its value", (name, value, message) => {
    const e = refused({ ...DEPLOYED, [name]: value });
    expect(e.variable).toBe(name);
    expect(e.message).toMatch(message);
  });
});

describe("the function's hf_export settings", () => {
  const EXPORT = {
    ...DEPLOYED,
    ORBAX2REG_EXPORT_DESTINATION_TEMPLATE: "gs://{bucket}/{root}/hf/{step}",
    ORBAX2REG_EXPORT_EVERY_N_STEPS: "5000",
    ORBAX2REG_EXPORT_STEPS: "100, 200",
    ORBAX2REG_EXPORT_DTYPE: "bfloat16",
    ORBAX2REG_EXPORT_TOKENIZER: "",
    ORBAX2REG_EXPORT_MAX_SHARD_SIZE: "2GB",
    ORBAX2REG_EXPORT_TASKS: "8",
  };

  test("an empty export template (hf_export = null) exports nothing", () => {
    const c = triggerConfigFromEnv({ ...DEPLOYED, ORBAX2REG_EXPORT_DESTINATION_TEMPLATE: "", ORBAX2REG_EXPORT_TASKS: "" });
    expect(c.export).toBeUndefined();
    expect(c.exportSettings).toBeUndefined();
  });

  test("the steps, the folder and the settings passed in each argument", () => {
    const c = triggerConfigFromEnv(EXPORT);
    expect(c.export).toEqual({ everyNSteps: 5000, steps: [100, 200], destinationTemplate: "gs://{bucket}/{root}/hf/{step}" });
    expect(c.exportSettings).toEqual({ dtype: "bfloat16", max_shard_size: "2GB", tasks: 8 });
  });

  test("a template that does not end in {step}, or no steps, is a configuration error naming the variable", () => {
    expect(refused({ ...EXPORT, ORBAX2REG_EXPORT_DESTINATION_TEMPLATE: "gs://{bucket}/{root}/hf" }).message).toMatch(
      /ORBAX2REG_EXPORT_DESTINATION_TEMPLATE/,
    );
    expect(refused({ ...EXPORT, ORBAX2REG_EXPORT_EVERY_N_STEPS: "0", ORBAX2REG_EXPORT_STEPS: "" }).message).toMatch(
      /ORBAX2REG_EXPORT_EVERY_N_STEPS/,
    );
    expect(refused({ ...EXPORT, ORBAX2REG_EXPORT_STEPS: "1,x" }).message).toMatch(/ORBAX2REG_EXPORT_STEPS/);
    expect(refused({ ...EXPORT, ORBAX2REG_EXPORT_DTYPE: "float16" }).message).toMatch(/ORBAX2REG_EXPORT_DTYPE/);
  });
});
