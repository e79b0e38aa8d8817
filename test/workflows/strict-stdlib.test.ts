import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { parse as parseYaml, stringify } from "yaml";
import { startWorkflows } from "../e2e/emulators.js";
import { removeScratch, scratch } from "../helpers/convert.js";
import type { Running } from "../helpers/servers.js";
import { runWorkflow } from "./emulator.js";

// The Workflows emulator is as strict as Google's reference (docs/workflows-reference.md): the same mistake
// that Google would reject fails here too. Tiny workflows run through the emulator, some built from
// workflows/convert.yaml's own subworkflows.

const convert = parseYaml(readFileSync("workflows/convert.yaml", "utf8")) as Record<string, unknown>;
let dir: string;
/** A Workflows expression, as written in a workflow. */
const wf = (code: string) => `\${${code}}`;
let emulator: Running;

/** Writes workflow `id` (main plus the named subworkflows of convert.yaml) into the emulator's directory. */
function deploy(id: string, main: unknown, borrowed: string[] = []): string {
  const definition: Record<string, unknown> = { main };
  for (const name of borrowed) definition[name] = convert[name];
  writeFileSync(join(dir, "workflows", `${id}.yaml`), stringify(definition));
  return id;
}

/** A main that evaluates each expression in its own try, returning {label: value} or {label: {tags}} on error. */
function probe(cases: Record<string, string>) {
  const steps: unknown[] = [{ init: { assign: [{ m: { a: { b: 1 } } }, { nothing: null }, { out: {} }] } }];
  for (const [label, code] of Object.entries(cases)) {
    steps.push({
      [label]: {
        try: { steps: [{ evaluate: { assign: [{ [`out.${label}`]: `\${${code}}` }] } }] },
        except: { as: "e", steps: [{ caught: { assign: [{ [`out.${label}`]: { error: wf("e.tags") } }] } }] },
      },
    });
  }
  steps.push({ done: { return: wf("out") } });
  return { steps };
}

beforeAll(async () => {
  dir = scratch("wfemu-strict");
  mkdirSync(join(dir, "workflows"));
  // A storage stand-in that answers JSON as text for "text.json" and as a parsed map for "map.json": Google
  // does not document which one objects.get with alt=media returns for a JSON object.
  writeFileSync(
    join(dir, "gcs-get.mjs"),
    `let s = ""; for await (const c of process.stdin) s += c;
     const { args } = JSON.parse(s); const body = { message: "hi", n: 1 };
     process.stdout.write(JSON.stringify(args.object === "map.json" ? body : JSON.stringify(body)));`,
  );
  writeFileSync(
    join(dir, "hooks.yaml"),
    stringify({
      hooks: {
        "googleapis.storage.v1.objects.get": { command: ["node", "gcs-get.mjs"], timeout: 30 },
        "googleapis.run.v2.projects.locations.operations.get": { command: ["node", "-e", "process.stdout.write('{}')"], timeout: 30 },
      },
    }),
  );
  emulator = await startWorkflows(
    { workflowsDir: join(dir, "workflows"), hooks: join(dir, "hooks.yaml"), userEnv: {}, env: {} },
    join(dir, "wfemu.log"),
  );
}, 60_000);

afterAll(async () => {
  await emulator?.stop();
  removeScratch();
});

const typeError = { error: expect.arrayContaining(["TypeError"]) };

describe("the Workflows emulator's standard library", () => {
  test("takes only the argument types Google documents, raising a catchable TypeError otherwise", async () => {
    const run = await runWorkflow(
      emulator,
      deploy(
        "types",
        probe({
          int_of_int: "int(5)",
          int_of_string: 'int("5")',
          int_of_double: "int(2.7)",
          double_of_int: "double(3) / 2",
          string_of_string: 'string("x")',
          string_of_bool: "string(true)",
          keys_of_string: 'keys("x")',
          keys_of_map: "keys(m)",
          len_of_bytes: 'len(json.encode("x"))',
          base64_of_string: 'base64.encode("x")',
          base64_of_bytes: 'base64.encode(json.encode("x"))',
          regex_on_int: 'text.match_regex(5, "x")',
          format_of_string: 'time.format("x")',
          format_of_double: "len(time.format(sys.now())) > 0",
          concat_to_string: 'list.concat("x", 1)',
          decode_of_int: "json.decode(5)",
          get_of_null: 'map.get(nothing, "x")',
          get_nested: 'map.get(m, ["a", "b"])',
          get_missing_nested: 'map.get(m, ["a", "z", "q"])',
          default_of_null: "default(nothing, 2)",
          encode_digits: 'json.encode_to_string("8")',
        }),
      ),
    );
    expect(run.state).toBe("SUCCEEDED");
    expect(run.result).toEqual({
      int_of_int: typeError,
      int_of_string: 5,
      int_of_double: 2,
      double_of_int: 1.5,
      string_of_string: typeError,
      string_of_bool: "true",
      keys_of_string: typeError,
      keys_of_map: ["a"],
      len_of_bytes: typeError,
      base64_of_string: typeError,
      base64_of_bytes: "Ingi", // "x" as JSON
      regex_on_int: typeError,
      format_of_string: typeError,
      format_of_double: true,
      concat_to_string: typeError,
      decode_of_int: typeError,
      get_of_null: null,
      get_nested: 1,
      get_missing_nested: null,
      default_of_null: 2,
      encode_digits: '"8"',
    });
  });

  test("a function Google does not have fails the execution, even where Python has one", async () => {
    for (const code of ["str(5)", "sys.os", "text.re", "type(1)"]) {
      const run = await runWorkflow(emulator, deploy("unknown", { steps: [{ go: { return: `\${${code}}` } }] }));
      expect(run.state, code).toBe("FAILED");
    }
  });

  test("a switch runs only its first true condition", async () => {
    const run = await runWorkflow(
      emulator,
      deploy("switch", {
        steps: [
          { init: { assign: [{ seen: [] }] } },
          {
            pick: {
              switch: [
                { condition: wf("true"), assign: [{ seen: wf('list.concat(seen, "first")') }] },
                { condition: wf("true"), assign: [{ seen: wf('list.concat(seen, "second")') }] },
              ],
            },
          },
          { done: { return: wf("seen") } },
        ],
      }),
    );
    expect(run.result).toEqual(["first"]);
  });

  test("connector_params take only the fields Google documents", async () => {
    const call = (params: unknown) => ({
      steps: [
        {
          go: {
            try: {
              call: "googleapis.run.v2.projects.locations.operations.get",
              args: { name: "projects/p/locations/l/operations/o", connector_params: params },
              result: "op",
            },
            except: { as: "e", steps: [{ caught: { return: wf("e.tags") } }] },
          },
        },
        { done: { return: "ok" } },
      ],
    });
    expect((await runWorkflow(emulator, deploy("params", call({ poll_every: 5 })))).result).toEqual(["ValueError"]);
    expect((await runWorkflow(emulator, deploy("params", call({ timeout: 0 })))).result).toEqual(["ValueError"]);
    expect((await runWorkflow(emulator, deploy("params", call({ skip_polling: true, timeout: 60 })))).result).toBe("ok");
  });
});

describe("workflows/convert.yaml's helpers on the strict emulator", () => {
  test("read_json reads a JSON object whether the storage connector returns its text or the parsed map", async () => {
    const main = {
      steps: [
        { as_text: { call: "read_json", args: { bucket: "b", object: "text.json" }, result: "a" } },
        { as_map: { call: "read_json", args: { bucket: "b", object: "map.json" }, result: "b" } },
        { done: { return: { text: wf("a"), map: wf("b") } } },
      ],
    };
    const run = await runWorkflow(emulator, deploy("readjson", main, ["read_json", "retryable"]));
    expect(run.state).toBe("SUCCEEDED");
    expect(run.result).toEqual({ text: { message: "hi", n: 1 }, map: { message: "hi", n: 1 } });
  });

  test("the retry predicate retries 5xx, 429 and 408 (code kept), timeouts and failed executions; never another 4xx or a permanent error", async () => {
    const errors = {
      http500: { tags: ["HttpError"], code: 500 },
      http502: { tags: ["HttpError"], code: 502 },
      http429: { tags: ["HttpError"], code: 429 },
      http408: { tags: ["HttpError"], code: 408 },
      http400: { tags: ["HttpError"], code: 400 },
      http_no_code: { tags: ["HttpError"] },
      permanent: { tags: ["PermanentError"] },
      still_running: { tags: ["ExecutionStillRunning"] },
      timeout: { tags: ["TimeoutError"] },
      failed_execution: { tags: ["OperationError"] },
      connection: { tags: ["ConnectionError"] },
      untagged: { message: "x" },
    };
    const steps: unknown[] = [{ init: { assign: [{ out: {} }] } }];
    for (const [label, e] of Object.entries(errors)) {
      steps.push(
        { [label]: { call: "retryable", args: { e }, result: "verdict" } },
        { [`keep_${label}`]: { assign: [{ [`out.${label}`]: wf("verdict") }] } },
      );
    }
    steps.push({ done: { return: wf("out") } });
    const run = await runWorkflow(emulator, deploy("predicate", { steps }, ["retryable"]));
    expect(run.result).toEqual({
      http500: true,
      http502: true,
      http429: true,
      http408: true,
      http400: false,
      http_no_code: false,
      permanent: false,
      still_running: false,
      timeout: true,
      failed_execution: true,
      connection: true,
      untagged: false,
    });
  });
});
