#!/usr/bin/env node
// Which HTTP client the storage requests use: undici's request() (through src/store/http.ts, as the product sends
// them) against node:http / node:https with a keep-alive Agent, over plain HTTP and over TLS with the test CA.
// A server in another process (so that its CPU is not counted) serves 256 MiB for a GET and swallows a PUT; the
// client downloads it and uploads as much, streamed in 64 KiB pieces. Best of N per cell, interleaved; the
// client process's wall time and CPU (user + sys), and undici's ratio to node's. See bench/README.md.
//
//   npm run build && node bench/http-client.mjs [--runs N] [--mib M]
import { spawn } from "node:child_process";
import { once } from "node:events";
import http from "node:http";
import https from "node:https";
import { clientTls, serverTls, trusted } from "../test/helpers/tls.mjs";
import { flag, flags, fmt, ROOT, requireBuilt, say } from "./lib.mjs";

const opts = flags(process.argv.slice(2), { "--runs": flag.count(3), "--mib": flag.count(256, "M") });
const RUNS = opts.runs;
const SIZE = opts.mib * 2 ** 20;
requireBuilt({ file: "dist/src/store/http.js" });
// Imported once the build is known to be there, so that a missing dist/ says how to build it.
const { Http, NO_CREDENTIALS } = await import("../dist/src/store/http.js");
process.chdir(ROOT);
const PIECE = 64 << 10;

if (!trusted()) {
  // NODE_EXTRA_CA_CERTS is read at start: run again with it set.
  const { runTrustingTestCa } = await import("../test/helpers/tls.mjs");
  await runTrustingTestCa();
}

/** The server, in a child process: GET sends SIZE bytes, PUT reads and drops its body. */
const SERVER = `
const [proto, size, key, cert] = [process.argv[1], Number(process.argv[2]), process.argv[3], process.argv[4]];
const mod = require(proto === "https" ? "node:https" : "node:http");
const piece = require("node:crypto").randomBytes(1 << 20);
const opts = proto === "https" ? { key: Buffer.from(key, "base64"), cert: Buffer.from(cert, "base64") } : {};
const srv = mod.createServer(opts, async (req, res) => {
  if (req.method === "PUT") { req.resume(); req.on("end", () => res.end("ok")); return; }
  res.writeHead(200, { "content-length": String(size) });
  for (let left = size; left > 0; left -= piece.length) {
    if (!res.write(left >= piece.length ? piece : piece.subarray(0, left))) await new Promise((r) => res.once("drain", r));
  }
  res.end();
});
srv.keepAliveTimeout = 60000;
srv.listen(0, "127.0.0.1", () => process.stdout.write(String(srv.address().port) + "\\n"));
`;

async function startServer(proto) {
  const { key, cert } = serverTls();
  const child = spawn(process.execPath, ["-e", SERVER, proto, String(SIZE), key.toString("base64"), cert.toString("base64")], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const [line] = await once(child.stdout, "data");
  return { url: `${proto}://127.0.0.1:${String(line).trim()}`, stop: () => child.kill() };
}

async function* upload() {
  const piece = Buffer.alloc(PIECE, 7);
  for (let left = SIZE; left > 0; left -= PIECE) yield Buffer.from(piece); // each piece its own, as a Store gives
}

const ours = new Http(NO_CREDENTIALS, { stallMs: 30_000 });
const clients = {
  undici: {
    get: async (url) => {
      const a = await ours.send("GET", `${url}/obj`, { accept: [200], path: "bench" });
      let n = 0;
      for await (const p of a.body()) n += p.length;
      return n;
    },
    put: async (url) => {
      const a = await ours.send("PUT", `${url}/sink`, {
        headers: { "content-length": String(SIZE) },
        body: upload(),
        accept: [200],
        path: "bench",
      });
      await a.discard();
      return SIZE;
    },
  },
  node: (() => {
    const agents = { http: new http.Agent({ keepAlive: true }), https: new https.Agent({ keepAlive: true, ...clientTls() }) };
    const modOf = (url) => (url.startsWith("https:") ? [https, agents.https] : [http, agents.http]);
    return {
      get: (url) =>
        new Promise((resolve, reject) => {
          const [mod, agent] = modOf(url);
          mod
            .get(`${url}/obj`, { agent }, async (res) => {
              let n = 0;
              for await (const p of res) n += p.length;
              resolve(n);
            })
            .on("error", reject);
        }),
      put: (url) =>
        new Promise((resolve, reject) => {
          const [mod, agent] = modOf(url);
          const req = mod.request(`${url}/sink`, { method: "PUT", agent, headers: { "content-length": String(SIZE) } }, (res) => {
            res.resume();
            res.on("end", () => resolve(SIZE));
          });
          req.on("error", reject);
          (async () => {
            for await (const p of upload()) if (!req.write(p)) await once(req, "drain");
            req.end();
          })().catch(reject);
        }),
    };
  })(),
};

async function timed(fn) {
  const t = process.hrtime.bigint();
  const c = process.cpuUsage();
  const n = await fn();
  const cpu = process.cpuUsage(c);
  if (n !== SIZE) throw new Error(`moved ${n} bytes, not ${SIZE}`);
  return { wall: Number(process.hrtime.bigint() - t) / 1e9, cpu: (cpu.user + cpu.system) / 1e6 };
}

say(`# HTTP client: undici (src/store/http.ts) against node:http(s) with a keep-alive Agent; ${SIZE / 2 ** 20} MiB, best of ${RUNS}`);
say();
say("| transport | direction | undici wall | node wall | undici CPU | node CPU | wall undici/node | CPU undici/node |");
say("|---|---|---:|---:|---:|---:|---:|---:|");
for (const proto of ["http", "https"]) {
  const server = await startServer(proto);
  try {
    for (const dir of ["get", "put"]) {
      const best = { undici: { wall: Infinity, cpu: Infinity }, node: { wall: Infinity, cpu: Infinity } };
      await clients.undici[dir](server.url); // warm-up: connections and TLS sessions
      await clients.node[dir](server.url);
      for (let i = 0; i < RUNS; i++) {
        for (const name of ["undici", "node"]) {
          const r = await timed(() => clients[name][dir](server.url));
          best[name].wall = Math.min(best[name].wall, r.wall);
          best[name].cpu = Math.min(best[name].cpu, r.cpu);
        }
      }
      const u = best.undici;
      const n = best.node;
      say(
        `| ${proto === "https" ? "TLS" : "plain HTTP"} | ${dir === "get" ? "download" : "upload"} | ${fmt(u.wall, 3)} s | ${fmt(n.wall, 3)} s | ${fmt(u.cpu, 3)} s | ${fmt(n.cpu, 3)} s | ${fmt(u.wall / n.wall, 2)}x | ${fmt(u.cpu / n.cpu, 2)}x |`,
      );
    }
  } finally {
    server.stop();
  }
}
process.exit(0);
