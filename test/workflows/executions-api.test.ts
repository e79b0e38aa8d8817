import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { stringify } from "yaml";
import { executionsClient, workflowsExecutions } from "../../src/cloud/api/executions.js";
import { startWorkflows } from "../e2e/emulators.js";
import { removeScratch, scratch } from "../helpers/convert.js";
import type { Running } from "../helpers/servers.js";
import { LOCATION, PROJECT } from "./emulator.js";

// The Workflows emulator's executions.list and executions.get answer as Google documents them
// (https://cloud.google.com/workflows/docs/reference/executions/rest/v1/projects.locations.workflows.executions/list,
// .../get, .../ExecutionView): list gives the BASIC view unless FULL is asked for, in pages (100 by default, at most
// 1000 BASIC or 100 FULL) joined by page tokens, newest created first; get gives FULL. And src/cloud/api/executions.ts
// reads every page and asks for FULL where it needs the argument.

const COUNT = 1_100; // more than one BASIC page (1000), eleven FULL pages (100)
const WORKFLOW = `projects/${PROJECT}/locations/${LOCATION}/workflows/echo`;
const BASIC = ["name", "startTime", "endTime", "duration", "state", "workflowRevisionId"];

let dir: string;
let emulator: Running;
const api = (path: string) => `${emulator.url}/v1/${path}`;
const listPage = async (query: string) => {
  const r = await fetch(api(`${WORKFLOW}/executions?${query}`));
  return { status: r.status, body: (await r.json()) as { executions?: Record<string, unknown>[]; nextPageToken?: string } };
};

beforeAll(async () => {
  dir = scratch("wfemu-api");
  mkdirSync(join(dir, "workflows"));
  writeFileSync(join(dir, "workflows", "echo.yaml"), stringify({ main: { params: ["args"], steps: [{ done: { return: `\${args}` } }] } }));
  writeFileSync(join(dir, "hooks.yaml"), stringify({ hooks: {} }));
  emulator = await startWorkflows(
    { workflowsDir: join(dir, "workflows"), hooks: join(dir, "hooks.yaml"), userEnv: {}, env: process.env },
    join(dir, "wfemu.log"),
  );
  for (let i = 0; i < COUNT; i += 10) {
    await Promise.all(
      Array.from({ length: Math.min(10, COUNT - i) }, (_, j) =>
        fetch(api(`${WORKFLOW}/executions`), {
          method: "POST",
          body: JSON.stringify({ argument: JSON.stringify({ n: i + j }), labels: { batch: i + j < 100 ? "first" : "rest" } }),
        }),
      ),
    );
  }
}, 300_000);

afterAll(async () => {
  await emulator?.stop();
  removeScratch();
});

describe("executions.list and executions.get on the Workflows emulator", () => {
  test("list gives the BASIC view by default: no argument, labels, result or error", async () => {
    const { body } = await listPage("");
    for (const e of body.executions ?? []) for (const k of Object.keys(e)) expect(BASIC).toContain(k);
    expect(body.executions?.[0]).toHaveProperty("name");
  });

  test("list with view=FULL and get by default give every field", async () => {
    const { body } = await listPage("view=FULL&pageSize=1");
    const listed = body.executions?.[0] as Record<string, unknown>;
    expect(listed).toMatchObject({ argument: expect.any(String), labels: expect.any(Object), createTime: expect.any(String) });
    const got = (await (await fetch(api(listed.name as string))).json()) as Record<string, unknown>;
    expect(got).toMatchObject({ argument: listed.argument, labels: listed.labels });
  });

  test("pages hold 100 by default, at most 1000 BASIC and 100 FULL, larger sizes coerced down", async () => {
    expect((await listPage("")).body.executions).toHaveLength(100);
    expect((await listPage("pageSize=5000")).body.executions).toHaveLength(1000);
    expect((await listPage("view=FULL&pageSize=1000")).body.executions).toHaveLength(100);
  });

  test("page tokens lead through every execution once, newest created first", async () => {
    const seen: string[] = [];
    const created: string[] = [];
    let token = "";
    for (;;) {
      const { body } = await listPage(`view=FULL&pageSize=100${token ? `&pageToken=${token}` : ""}`);
      for (const e of body.executions ?? []) {
        seen.push(e.name as string);
        created.push(e.createTime as string);
      }
      if (!body.nextPageToken) break;
      token = body.nextPageToken;
    }
    expect(seen).toHaveLength(COUNT);
    expect(new Set(seen).size).toBe(COUNT);
    expect([...created].sort().reverse()).toEqual(created);
  });

  test("a page token used with other parameters is refused", async () => {
    const { body } = await listPage("pageSize=10");
    expect((await listPage(`pageSize=10&view=FULL&pageToken=${body.nextPageToken}`)).status).toBe(400);
  });

  test("filters on labels and on createTime", async () => {
    const { body } = await listPage('filter=labels.batch="first"&pageSize=1000');
    expect(body.executions).toHaveLength(100);
    const newest = (await listPage("view=FULL&pageSize=3")).body.executions as Record<string, unknown>[];
    const since = (newest[2] as Record<string, unknown>).createTime as string;
    const recent = await listPage(`filter=${encodeURIComponent(`createTime>="${since}"`)}`);
    expect(recent.body.executions?.map((e) => e.name)).toEqual(newest.map((e) => e.name));
  });
});

describe("orbax2reg's executions client over the emulator", () => {
  test("find reads every BASIC page; findFull every FULL page, with the arguments", async () => {
    const executions = workflowsExecutions(await executionsClient(emulator.url));
    const basic = await executions.find(WORKFLOW, {});
    expect(basic).toHaveLength(COUNT);
    expect(basic[0]).not.toHaveProperty("argument");
    const full = await executions.findFull(WORKFLOW, { batch: "rest" });
    expect(full).toHaveLength(COUNT - 100);
    expect(full.map((e) => JSON.parse(e.argument).n as number).sort((a, b) => a - b)).toEqual(
      Array.from({ length: COUNT - 100 }, (_, i) => i + 100),
    );
    expect((await executions.get(full[0]?.name as string)).argument).toBe(full[0]?.argument);
  });

  test("find with createdSince leaves out executions created before it", async () => {
    const executions = workflowsExecutions(await executionsClient(emulator.url));
    const all = await executions.findFull(WORKFLOW, {});
    const since = (await (await fetch(api(all[9]?.name as string))).json()) as { createTime: string };
    const recent = await executions.find(WORKFLOW, {}, { createdSince: since.createTime });
    expect(recent.map((e) => e.name)).toEqual(all.slice(0, 10).map((e) => e.name));
  });
});

describe("a backlog on the Workflows emulator (--max-active: the concurrent executions quota)", () => {
  let queueing: Running;
  const SLEEPY = `projects/${PROJECT}/locations/${LOCATION}/workflows/sleepy`;
  const at = (path: string) => `${queueing.url}/v1/${path}`;
  const create = async (seconds: number) =>
    (await (
      await fetch(at(`${SLEEPY}/executions`), { method: "POST", body: JSON.stringify({ argument: JSON.stringify({ seconds }) }) })
    ).json()) as {
      name: string;
      state: string;
      startTime?: string;
    };
  const get = async (name: string) => (await (await fetch(at(name))).json()) as Record<string, string>;
  const cancel = (name: string) => fetch(at(`${name}:cancel`), { method: "POST", body: "{}" });

  beforeAll(async () => {
    const workflows = join(dir, "sleepy");
    mkdirSync(workflows);
    writeFileSync(
      join(workflows, "sleepy.yaml"),
      stringify({
        main: {
          params: ["args"],
          steps: [{ wait: { call: "sys.sleep", args: { seconds: `\${args.seconds}` } } }, { done: { return: 1 } }],
        },
      }),
    );
    queueing = await startWorkflows(
      {
        workflowsDir: workflows,
        hooks: join(dir, "hooks.yaml"),
        userEnv: {},
        env: process.env,
        args: ["--max-active", "1", "--backoff-scale", "1"],
      },
      join(dir, "wfemu-queue.log"),
    );
  });

  afterAll(async () => {
    await queueing?.stop();
  });

  test("an execution beyond the quota waits QUEUED without a startTime, and begins when a slot frees", async () => {
    const first = await create(60);
    const second = await create(0);
    const third = await create(0);
    expect(first.state).toBe("ACTIVE");
    expect(second).toMatchObject({ state: "QUEUED" });
    expect(second).not.toHaveProperty("startTime");
    expect(await get(second.name)).toMatchObject({ state: "QUEUED", createTime: expect.any(String) });
    expect(await get(second.name)).not.toHaveProperty("startTime");

    // orbax2reg's look-ups match by createTime, so a queued execution is found, newest created first.
    const executions = workflowsExecutions(await executionsClient(queueing.url));
    const since = (await get(first.name)).createTime as string;
    expect((await executions.find(SLEEPY, {}, { createdSince: since })).map((e) => [e.name, e.state, e.startTime])).toEqual([
      [third.name, "QUEUED", undefined],
      [second.name, "QUEUED", undefined],
      [first.name, "ACTIVE", expect.any(String)],
    ]);

    await cancel(third.name); // cancelled while queued: it never begins
    await cancel(first.name); // frees the slot: the oldest queued one begins
    for (let i = 0; i < 100 && (await get(second.name)).state !== "SUCCEEDED"; i++) await new Promise((r) => setTimeout(r, 100));
    const [a, b, c] = [await get(first.name), await get(second.name), await get(third.name)];
    expect(b).toMatchObject({ state: "SUCCEEDED", startTime: expect.any(String) });
    expect((b.startTime as string) >= (a.endTime as string)).toBe(true);
    expect(c.state).toBe("CANCELLED");
    expect(c).not.toHaveProperty("startTime");
  });
});
