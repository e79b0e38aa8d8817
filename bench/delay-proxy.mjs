#!/usr/bin/env node
// A plain-HTTP proxy on loopback that holds every answer for a fixed time, as Cloud Storage's own latency does
// (tens of ms per request), and counts the requests it relays by kind. bench/gcs.mjs runs it in a process of its
// own (so that its CPU is neither the client's nor the benchmark's event loop's) between a client and
// fake-gcs-server's plain-HTTP port.
//
//   node bench/delay-proxy.mjs UPSTREAM_URL DELAY_MS      # prints {"url": ...} once listening
//
// The answer's headers are held DELAY_MS after the server sent them (a request's body is forwarded as it comes,
// so an upload is not slowed beyond its one held answer). A resumable session's Location naming the upstream is
// rewritten to the proxy, so every chunk of the session is held too. GET /__stats gives the counts since the last
// GET /__reset: requests by kind, and the most in flight at once (overall and by kind); GET /__log every request.
import http from "node:http";
import { flags, usageError } from "./lib.mjs";

const [upstreamArg, delayArg = "30"] = flags(
  process.argv.slice(2),
  {},
  { positionals: { names: "UPSTREAM_URL [DELAY_MS]", min: 1, max: 2 } },
)._;
if (!URL.canParse(upstreamArg)) usageError(`UPSTREAM_URL takes a URL, not "${upstreamArg}"`);
const upstream = new URL(upstreamArg);
const DELAY = delayArg.trim() === "" ? Number.NaN : Number(delayArg);
if (!(DELAY >= 0)) usageError(`DELAY_MS takes a number >= 0, not "${delayArg}"`);
const agent = new http.Agent({ keepAlive: true, maxSockets: 512 });

/** What a request is, in the JSON API's terms (https://cloud.google.com/storage/docs/json_api/v1/objects). */
function kind(method, url) {
  const [path, query = ""] = url.split("?");
  const q = new URLSearchParams(query);
  if (path.startsWith("/upload/")) {
    if (q.get("upload_id")) return "resumable chunk";
    return `upload (${q.get("uploadType") ?? "?"})`;
  }
  if (method === "DELETE") return "delete";
  if (/\/o$/.test(path)) return "list";
  if (/\/o\/[^/]+$/.test(path)) return q.get("alt") === "media" ? "download" : "metadata";
  return `other ${method}`;
}

let stats;
/** Every request since the last reset: its kind, method, URL, and when it came and was answered (ms). */
let log;
const reset = () => {
  log = [];
  stats = { requests: 0, byKind: {}, inFlight: 0, maxInFlight: 0, inFlightByKind: {}, maxInFlightByKind: {} };
};
reset();

const server = http.createServer((req, res) => {
  if (req.url === "/__stats") return void res.end(JSON.stringify(stats));
  if (req.url === "/__log") return void res.end(JSON.stringify(log));
  if (req.url === "/__reset") {
    reset();
    return void res.end("{}");
  }
  const k = kind(req.method, req.url);
  stats.requests++;
  stats.byKind[k] = (stats.byKind[k] ?? 0) + 1;
  stats.inFlight++;
  stats.maxInFlight = Math.max(stats.maxInFlight, stats.inFlight);
  stats.inFlightByKind[k] = (stats.inFlightByKind[k] ?? 0) + 1;
  stats.maxInFlightByKind[k] = Math.max(stats.maxInFlightByKind[k] ?? 0, stats.inFlightByKind[k]);
  const entry = { kind: k, method: req.method, url: req.url, start: performance.now() };
  log.push(entry);
  let done = false;
  const finish = () => {
    if (done) return;
    done = true;
    entry.end = performance.now();
    stats.inFlight--;
    stats.inFlightByKind[k]--;
  };
  res.on("close", finish);
  const self = `http://${req.headers.host}`;
  const up = http.request(
    { agent, host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers: req.headers },
    (answer) => {
      setTimeout(() => {
        const headers = { ...answer.headers };
        if (typeof headers.location === "string") headers.location = headers.location.replace(upstream.origin, self);
        res.writeHead(answer.statusCode, headers);
        answer.pipe(res);
      }, DELAY);
    },
  );
  up.on("error", () => res.destroy());
  req.on("error", () => up.destroy());
  res.on("close", () => {
    if (!res.writableFinished) up.destroy();
  });
  req.pipe(up);
});
server.keepAliveTimeout = 60_000;
server.listen(0, "127.0.0.1", () => console.log(JSON.stringify({ url: `http://127.0.0.1:${server.address().port}` })));
