import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { stringify } from "yaml";
import { startWorkflows } from "../e2e/emulators.js";
import { removeScratch, scratch } from "../helpers/convert.js";
import { processAlive, type Running } from "../helpers/servers.js";
import { LOCATION, PROJECT } from "./emulator.js";

// Cancelling an execution on the Workflows emulator stops it, as Google does: the workflow runs no further
// step, starts no further connector call (a running one is stopped), and no try/except inside it gets to
// handle the cancellation. `orbax2reg cloud cancel` relies on it: a cancelled conversion starts no more jobs.

let dir: string;
let emulator: Running;
const file = (...names: string[]) => join(dir, ...names);

/** The objects the hook was called for, in order (one line per call). */
const calls = (): string[] => {
  try {
    return readFileSync(file("calls.log"), "utf8").split("\n").filter(Boolean);
  } catch {
    return [];
  }
};
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const get = (name: string) => `\${${name}}`;

beforeAll(async () => {
  dir = scratch("wfemu-cancel");
  mkdirSync(file("workflows"));
  // The hook notes each call; object "slow" then waits a minute (a long connector call), noting its pid.
  writeFileSync(
    file("hook.mjs"),
    `import { appendFileSync } from "node:fs";
     let s = ""; for await (const c of process.stdin) s += c;
     const { args } = JSON.parse(s);
     appendFileSync(${JSON.stringify(file("calls.log"))}, args.object + "\\n");
     if (args.object === "slow") {
       appendFileSync(${JSON.stringify(file("pids.log"))}, process.pid + "\\n");
       await new Promise((r) => setTimeout(r, 60_000));
     }
     process.stdout.write("{}");`,
  );
  writeFileSync(
    file("hooks.yaml"),
    stringify({ hooks: { "googleapis.storage.v1.objects.get": { command: ["node", "hook.mjs"], timeout: 120 } } }),
  );
  // Ticks forever (sleeping between ticks); anything that reaches the except block notes "caught" and loops on.
  const call = (object: string) => ({ call: "googleapis.storage.v1.objects.get", args: { bucket: "b", object } });
  writeFileSync(
    file("workflows", "ticker.yaml"),
    stringify({
      main: {
        params: ["args"],
        steps: [
          {
            guarded: {
              try: {
                steps: [
                  { tick: call(get("args.object")) },
                  { rest: { call: "sys.sleep", args: { seconds: 0.05 } } },
                  { again: { next: "tick" } },
                ],
              },
              except: { as: "e", steps: [{ caught: call("caught") }, { loop: { next: "guarded" } }] },
            },
          },
        ],
      },
    }),
  );
  emulator = await startWorkflows({ workflowsDir: file("workflows"), hooks: file("hooks.yaml"), userEnv: {}, env: {} }, file("wfemu.log"));
}, 60_000);

afterAll(async () => {
  await emulator?.stop();
  removeScratch();
});

async function start(object: string): Promise<string> {
  const r = await fetch(`${emulator.url}/v1/projects/${PROJECT}/locations/${LOCATION}/workflows/ticker/executions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ argument: JSON.stringify({ object }) }),
  });
  if (!r.ok) throw new Error(`create: HTTP ${r.status} ${await r.text()}`);
  return ((await r.json()) as { name: string }).name;
}
const cancel = async (name: string) => {
  const r = await fetch(`${emulator.url}/v1/${name}:cancel`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: "{}",
  });
  return (await r.json()) as { state: string };
};
const state = async (name: string) => ((await (await fetch(`${emulator.url}/v1/${name}`)).json()) as { state: string }).state;

describe("cancelling a Workflows execution on the emulator", () => {
  test("a workflow calling a hook in a loop stops: the calls stop growing, no except block runs, it stays CANCELLED", async () => {
    const name = await start("tick");
    for (let i = 0; calls().filter((c) => c === "tick").length < 3; i++) {
      if (i > 200) throw new Error("the workflow never ticked");
      await sleep(50);
    }
    expect((await cancel(name)).state).toBe("CANCELLED");
    await sleep(500); // a call under way when the cancel came may still note itself
    const after = calls().length;
    await sleep(1500);
    expect(calls().length).toBe(after);
    expect(calls()).not.toContain("caught");
    expect(await state(name)).toBe("CANCELLED");
  });

  test("a connector call under way is stopped: its hook is killed", async () => {
    const name = await start("slow");
    let pid: number | undefined;
    for (let i = 0; pid === undefined; i++) {
      if (i > 200) throw new Error("the slow hook never started");
      await sleep(50);
      try {
        pid = Number(readFileSync(file("pids.log"), "utf8").split("\n")[0]);
      } catch {}
    }
    expect((await cancel(name)).state).toBe("CANCELLED");
    for (let i = 0; processAlive(pid) && i < 40; i++) await sleep(50);
    expect(processAlive(pid)).toBe(false);
    await sleep(500);
    expect(calls().filter((c) => c === "slow")).toHaveLength(1);
    expect(calls()).not.toContain("caught");
    expect(await state(name)).toBe("CANCELLED");
  });
});
