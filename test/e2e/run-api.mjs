// A loopback stand-in for the Cloud Run Admin API v2 (which has no emulator), serving the job executions that
// connector-hook.mjs plays with local processes, from the same state directory (run-state.mjs). Only what
// src/cloud/api/run-executions.ts uses, over the REST transport @google-cloud/run speaks with `fallback: true`:
//   GET  /v2/{name}          executions.get: the Execution resource
//        (https://cloud.google.com/run/docs/reference/rest/v2/projects.locations.jobs.executions/get)
//   POST /v2/{name}:cancel   executions.cancel: stops the tasks, answers a done Operation
//        (https://cloud.google.com/run/docs/reference/rest/v2/projects.locations.jobs.executions/cancel)
// Unknown names answer 404 NOT_FOUND, and cancelling a finished execution 400 FAILED_PRECONDITION, in Google's
// error shape {"error": {code, message, status}} (https://cloud.google.com/apis/design/errors#http_mapping).
//
// Usage: node run-api.mjs --state-dir DIR --port PORT [--host 127.0.0.1]
import { createServer } from "node:http";
import { parseArgs } from "node:util";
import { executionResource, idOf, killExecution, readState } from "./run-state.mjs";

const { values } = parseArgs({
  options: { "state-dir": { type: "string" }, port: { type: "string" }, host: { type: "string", default: "127.0.0.1" } },
});
const stateDir = values["state-dir"];
if (!stateDir || !values.port) {
  process.stderr.write("usage: run-api.mjs --state-dir DIR --port PORT [--host HOST]\n");
  process.exit(2);
}

const EXECUTION = /^\/v2\/(projects\/[^/]+\/locations\/[^/]+\/jobs\/[^/]+\/executions\/[^/:]+)(:cancel)?$/;

function send(res, status, body) {
  const data = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json; charset=utf-8", "content-length": Buffer.byteLength(data) });
  res.end(data);
}

const error = (res, code, status, message) => send(res, code, { error: { code, message, status } });

/** The execution's state, only when the name is exactly its name (not just the same last segment). */
function lookup(name) {
  const s = readState(stateDir, idOf(name));
  return s?.execution === name ? s : undefined;
}

/** A done Operation carrying the Execution, as metadata and as the response. */
function cancelOperation(s) {
  const [, project, , location] = s.execution.split("/");
  const execution = { "@type": "type.googleapis.com/google.cloud.run.v2.Execution", ...executionResource(s) };
  return {
    name: `projects/${project}/locations/${location}/operations/cancel-${idOf(s.execution)}`,
    metadata: execution,
    done: true,
    response: execution,
  };
}

async function handle(req, res) {
  const path = decodeURIComponent(new URL(req.url, "http://x").pathname);
  for await (const _ of req); // drain the body (the cancel request's fields are not used)
  const m = EXECUTION.exec(path);
  if (!m) return error(res, 404, "NOT_FOUND", `no such method or resource: ${req.method} ${path}`);
  const [, name, cancel] = m;
  const s = lookup(name);
  if (s === undefined) return error(res, 404, "NOT_FOUND", `Resource '${name}' was not found`);
  if (!cancel && req.method === "GET") return send(res, 200, executionResource(s));
  if (cancel && req.method === "POST") {
    if (s.done) return error(res, 400, "FAILED_PRECONDITION", `Execution ${name} has already finished`);
    const cancelled = await killExecution(stateDir, idOf(name));
    process.stdout.write(`${JSON.stringify({ cancelled: name, at: Date.now() })}\n`);
    return send(res, 200, cancelOperation(cancelled));
  }
  return error(res, 501, "UNIMPLEMENTED", `${req.method} ${path} is not supported`);
}

const server = createServer((req, res) => {
  handle(req, res).catch((e) => error(res, 500, "INTERNAL", e instanceof Error ? e.message : String(e)));
});
server.listen(Number(values.port), values.host, () => {
  process.stdout.write(`run-api stand-in listening on http://${values.host}:${values.port} (state: ${stateDir})\n`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
