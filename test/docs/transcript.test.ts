import { describe, expect, test } from "vitest";
import { compareOutput, mask, transcripts } from "../helpers/transcript.js";

describe("docs transcripts", () => {
  test("a fenced block starting with `$ ` is a transcript of commands and their output", () => {
    const md = ["text", "```", "$ echo a", "a", "", "$ true", "```", "```sh", "orbax2reg convert gs://b/x gs://b/y", "```"].join("\n");
    expect(transcripts(md)).toEqual([
      {
        line: 2,
        steps: [
          { command: "echo a", expected: ["a"] },
          { command: "true", expected: [] },
        ],
      },
    ]);
  });

  test("times, rates and sizes are masked; counts are not", () => {
    expect(mask("converted step 100: 15 arrays, 49.6 KiB in 0.1 s (0.4 MB/s); 81 objects written")).toBe(
      "converted step 100: 15 arrays, <measure> in <measure> (<measure>); 81 objects written",
    );
  });

  test("the commit a build reports is masked", () => {
    expect(mask("orbax2reg 0.2.0 (commit 348b35bdce98, clean)")).toBe(mask("orbax2reg 0.2.0 (commit 0123456789ab, dirty)"));
  });

  test("a line `…` stands for one or more printed lines", () => {
    expect(compareOutput(["PASS index", "…", "18 passed"], ["PASS index", "PASS a", "PASS b", "18 passed"])).toBeNull();
    expect(compareOutput(["PASS index", "…", "18 passed"], ["PASS index", "18 passed"])).not.toBeNull();
  });

  test("a difference names the line", () => {
    expect(compareOutput(["a", "b"], ["a", "c"])).toMatch(/line 2: the docs show\n {2}b\nthe command printed\n {2}c/);
  });
});
