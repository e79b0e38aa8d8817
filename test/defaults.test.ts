import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parse } from "@cdktf/hcl2json";
import { beforeAll, describe, expect, it } from "vitest";
import {
  CLAIM_LEASE_MARGIN_SECONDS,
  DEFAULT_CLAIM_LEASE_SECONDS,
  DEFAULT_CONVERT_EVERY_N_STEPS,
  DEFAULT_DESTINATION_TEMPLATE,
  DEFAULT_FUNCTION_CPU,
  DEFAULT_FUNCTION_MAX_INSTANCES,
  DEFAULT_FUNCTION_MEMORY,
  DEFAULT_FUNCTION_TIMEOUT_SECONDS,
  DEFAULT_GROUP_CPU,
  DEFAULT_GROUP_MEMORY,
  DEFAULT_GROUPS,
  DEFAULT_MAX_PARALLEL_GROUPS,
  DEFAULT_NAME_PREFIX,
  DEFAULT_WORKFLOW_NAME,
  LONGEST_CLAIM_LEASE_SECONDS,
  MAX_FUNCTION_TIMEOUT_SECONDS,
  MAX_GROUPS,
} from "../src/defaults.js";

// src/defaults.ts spells the deployment's defaults for the code that runs without terraform's help (the CLI, a
// function or job whose variable is unset); these are the same values terraform deploys.

const MODULE = "terraform/modules/orbax2reg";
type Variable = { default?: unknown; validation?: { condition: string }[] };
let variables: Record<string, Variable>;

const tfFile = (name: string) => readFileSync(join(MODULE, name), "utf8");
/** The one number `var.<name> <= N` bounds the variable by in its validation. */
const upperBound = (name: string): number => {
  const condition = variables[name]?.validation?.[0]?.condition ?? "";
  const m = new RegExp(`var\\.${name}\\s*<=\\s*(\\d+)`).exec(condition);
  if (!m) throw new Error(`no upper bound for var.${name} in ${JSON.stringify(condition)}`);
  return Number(m[1]);
};

beforeAll(async () => {
  const json = (await parse("variables.tf", tfFile("variables.tf"))) as { variable: Record<string, Variable[]> };
  variables = Object.fromEntries(Object.entries(json.variable).map(([name, [v]]) => [name, v as Variable]));
});

describe("the deployment's defaults are terraform's", () => {
  it("groups and their bound", () => {
    expect(variables.groups?.default).toBe(DEFAULT_GROUPS);
    expect(upperBound("groups")).toBe(MAX_GROUPS);
  });

  it("parallel groups", () => {
    expect(variables.max_parallel_groups?.default).toBe(DEFAULT_MAX_PARALLEL_GROUPS);
  });

  it("the function's instance bound and size", () => {
    expect(variables.function_max_instances?.default).toBe(DEFAULT_FUNCTION_MAX_INSTANCES);
    expect(variables.function_cpu?.default).toBe(DEFAULT_FUNCTION_CPU);
    expect(variables.function_memory?.default).toBe(DEFAULT_FUNCTION_MEMORY);
  });

  it("one convert-group task's size", () => {
    expect(variables.group_cpu?.default).toBe(DEFAULT_GROUP_CPU);
    expect(variables.group_memory?.default).toBe(DEFAULT_GROUP_MEMORY);
  });

  it("the destination template", () => {
    expect(variables.destination_template?.default).toBe(DEFAULT_DESTINATION_TEMPLATE);
  });

  it("the step selection", () => {
    expect(variables.convert_every_n_steps?.default).toBe(DEFAULT_CONVERT_EVERY_N_STEPS);
  });

  it("the workflow's name", () => {
    expect(variables.name_prefix?.default).toBe(DEFAULT_NAME_PREFIX);
    // terraform fmt aligns the `=` of a block's keys, so the spaces before it follow the longest key.
    const name = DEFAULT_WORKFLOW_NAME.slice(DEFAULT_NAME_PREFIX.length + 1);
    expect(tfFile("main.tf").split("\n")).toContainEqual(
      expect.stringMatching(new RegExp(`^ +workflow +=\\s"\\$\\{var\\.name_prefix\\}-${name}"$`)),
    );
  });

  it("the function's timeout and its claim lease, default and longest", () => {
    expect(variables.function_timeout_seconds?.default).toBe(DEFAULT_FUNCTION_TIMEOUT_SECONDS);
    expect(upperBound("function_timeout_seconds")).toBe(MAX_FUNCTION_TIMEOUT_SECONDS);
    const lease = `var.function_timeout_seconds + ${CLAIM_LEASE_MARGIN_SECONDS}`;
    expect(tfFile("function.tf")).toContain(`ORBAX2REG_CLAIM_LEASE_SECONDS = tostring(${lease})`);
    expect(tfFile("outputs.tf")).toContain(`value       = ${lease}\n`);
    expect(DEFAULT_CLAIM_LEASE_SECONDS).toBe(120);
    expect(LONGEST_CLAIM_LEASE_SECONDS).toBe(600);
  });

  it("the workflow's own fallbacks", () => {
    const yaml = readFileSync("workflows/convert.yaml", "utf8");
    expect(yaml).toContain(`sys.get_env("ORBAX2REG_GROUPS", "${DEFAULT_GROUPS}")`);
    expect(yaml).toContain(`sys.get_env("ORBAX2REG_MAX_PARALLEL_GROUPS", "${DEFAULT_MAX_PARALLEL_GROUPS}")`);
  });
});
