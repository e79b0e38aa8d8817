// A command whose reader went away (`orbax2reg inspect STEP | head -1`) ends quietly, as `git log | head` does:
// no EPIPE stack trace, and the status of a process SIGPIPE ended, 141. The reader here closes its end of the
// pipe before the CLI has even started, so every command's first line of output meets a closed pipe.
import { spawn } from "node:child_process";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { runCli } from "../helpers/cli.js";
import { fixtureCase, removeScratch, scratch } from "../helpers/convert.js";

afterAll(removeScratch);

const tiny = fixtureCase("tiny");

/** Runs the built CLI with stdout (or stderr) a pipe its reader has closed; its exit status and stderr (or stdout). */
function withClosedPipe(args: string[], closed: "stdout" | "stderr" = "stdout"): Promise<{ code: number | null; other: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ["bin/orbax2reg.js", ...args]);
    child[closed].destroy();
    let other = "";
    child[closed === "stdout" ? "stderr" : "stdout"].on("data", (d) => {
      other += d;
    });
    child.on("close", (code) => resolve({ code, other }));
  });
}

describe("a closed pipe ends the command quietly with status 141", () => {
  test("inspect", async () => {
    expect(await withClosedPipe(["inspect", tiny.location])).toEqual({ code: 141, other: "" });
  });

  test("--help", async () => {
    expect(await withClosedPipe(["export-hf", "--help"])).toEqual({ code: 141, other: "" });
  });

  test("ocdbt ls", async () => {
    expect(await withClosedPipe(["ocdbt", "ls", join(tiny.location, "state")])).toEqual({ code: 141, other: "" });
  });

  test("verify", async () => {
    const dest = scratch("closed-pipe");
    expect((await runCli(["convert", tiny.location, dest, "--no-progress"])).code).toBe(0);
    expect(await withClosedPipe(["verify", tiny.location, join(dest, tiny.stepDir)])).toEqual({ code: 141, other: "" });
  });

  test("stderr closed: an error's line has nowhere to go, and no stack trace follows on stdout", async () => {
    expect(await withClosedPipe(["inspect", join(tiny.location, "no-such-dir")], "stderr")).toEqual({ code: 141, other: "" });
  });
});
