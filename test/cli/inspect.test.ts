// What `inspect` says besides the array table: which processes saved the step, the leaves that are not
// arrays, and a table that stays readable however long an AXLearn path is.
import { describe, expect, test } from "vitest";
import { processesLine } from "../../src/cli/inspect.js";
import { main } from "../../src/cli/main.js";
import type { Output } from "../../src/cli/output.js";
import type { ProcessesReport } from "../../src/orbax/inspect.js";
import { runCli } from "../helpers/cli.js";
import { fixtureCase } from "../helpers/convert.js";

const tiny = fixtureCase("tiny");
const iterators = fixtureCase("iterators");

const processes = (count: number, databases: number[], arrayMetadatas = databases): ProcessesReport => ({
  count,
  databases,
  arrayMetadatas,
  iterators: [],
  missingIterators: [],
});

describe("the processes line", () => {
  test("says which processes have their own OCDBT database as processes, not a bare number that reads as a count", () => {
    expect(processesLine(processes(1, [0]))).toBe("1 process saved it (own OCDBT database: process 0; array_metadatas: process 0)");
  });

  test("reads right for several processes, and for none", () => {
    expect(processesLine(processes(2, [0, 1]))).toBe(
      "2 processes saved it (own OCDBT database: processes 0, 1; array_metadatas: processes 0, 1)",
    );
    expect(processesLine(processes(1, [], []))).toBe("1 process saved it (own OCDBT database: none; array_metadatas: none)");
  });

  test("is what the table ends with", async () => {
    const r = await runCli(["inspect", tiny.location]);
    expect(r.stdout).toMatch(/^1 process saved it \(own OCDBT database: process 0; array_metadatas: process 0\)$/m);
  });
});

describe("leaves that are not arrays", () => {
  test("are named under the totals, with the value type _METADATA gives them", async () => {
    const r = await runCli(["inspect", iterators.location]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(
      /^\d+ arrays, \d+ chunks, .* stored; 2 non-array leaves:\n {2}input_iter: PythonSavable\n {2}learner\/optimizer\/1\/1: None \(skip_deserialize\)$/m,
    );
  });

  test("are in --json as nonArrays, after the arrays (the rest of the object unchanged)", async () => {
    const report = JSON.parse((await runCli(["inspect", iterators.location, "--json"])).stdout);
    expect(Object.keys(report)).toEqual(["step", "committed", "layout", "processes", "arrays", "nonArrays"]);
    expect(report.nonArrays).toEqual([
      { path: "input_iter", name: "input_iter", valueType: "PythonSavable", skipDeserialize: false },
      { path: "learner/optimizer/1/1", name: "learner.optimizer.1.1", valueType: "None", skipDeserialize: true },
    ]);
  });

  test("a step with none says nothing of them", async () => {
    const r = await runCli(["inspect", tiny.location]);
    expect(r.stdout).toMatch(/^15 arrays, 66 chunks, 47\.1 KiB stored$/m);
    expect(JSON.parse((await runCli(["inspect", tiny.location, "--json"])).stdout).nonArrays).toEqual([]);
  });
});

/** The CLI with stdout a terminal `columns` wide. */
async function onTerminal(args: string[], columns: number): Promise<string> {
  let stdout = "";
  const out: Output = {
    stdout: (line) => {
      stdout += `${line}\n`;
    },
    writeOut: (text) => {
      stdout += text;
    },
    writeErr: () => {},
    warn: () => {},
    isTTY: false,
    columns,
  };
  expect(await main(args, out)).toBe(0);
  return stdout;
}

describe("the table's width", () => {
  test("on a terminal narrower than the table, each path has a line of its own, whole, and the rest follows indented", async () => {
    const text = await onTerminal(["inspect", tiny.location], 100);
    const lines = text.split("\n");
    expect(lines.slice(0, 2)).toEqual(["path", "  dtype     shape     chunk shape  chunks    stored  storage"]);
    const at = lines.indexOf("learner/optimizer/1/0/mu/decoder/layer/ffn/weight");
    expect(lines[at + 1]).toBe("  float32   (64, 64)  (16, 32)          8  15.2 KiB  out-of-line");
    expect(Math.max(...lines.map((l) => l.length))).toBeLessThanOrEqual(100);
  });

  test("on a terminal wide enough, one row per array", async () => {
    const text = await onTerminal(["inspect", tiny.location], 120);
    expect(text).toMatch(/^model\/decoder\/layer\/linear\/weight\s+bfloat16\s+\(4, 8\)\s+\(1, 4\)\s+8\s+136 B\s+inline$/m);
  });

  test("into a pipe or a file, one row per array whatever its width: nothing cut, one line to grep", async () => {
    const r = await runCli(["inspect", tiny.location, "--checksums", "--no-progress"]);
    expect(r.stdout).toMatch(/^learner\/optimizer\/1\/0\/mu\/decoder\/layer\/ffn\/weight\s+float32 .* out-of-line\s+[0-9a-f]{64}$/m);
  });
});
