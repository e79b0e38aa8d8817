// fake-gcs-server on loopback and the few JSON API calls the benchmarks make of it:
// buckets, uploads, listings, deletes and server-side copies. Used by bench/gcs.mjs, bench/rss.mjs and
// bench/scale.mjs: the one place the emulator is started, and stopped (its folder removed) when the benchmark
// exits or is killed. It serves HTTPS, as Cloud Storage does, with the tests' loopback certificate
// (test/helpers/tls.mjs); a benchmark that also needs plain HTTP (TensorStore's side-by-side) gets both, on two
// ports over the same objects. In front of the plain port, bench/gcs.mjs puts nginx terminating TLS (a TLS server
// TensorStore's curl works with) and bench/delay-proxy.mjs (a fixed latency per request). A benchmark's process and
// its children must trust the test CA (NODE_EXTRA_CA_CERTS): its entry point calls runTrustingTestCa() first.
import { spawn, spawnSync } from "node:child_process";
import { createReadStream, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { request as httpsRequest } from "node:https";
import { createServer } from "node:net";
import os from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { answersOk, clientTls, testTls } from "../test/helpers/tls.mjs";

export { runTrustingTestCa } from "../test/helpers/tls.mjs";

export const FAKE_GCS = ".tools/bin/fake-gcs-server";

async function freePort() {
  return new Promise((done, fail) => {
    const srv = createServer();
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => done(port));
    });
    srv.on("error", fail);
  });
}

/**
 * Starts the emulator, with its filesystem backend over an empty `root` or, without one, its memory backend;
 * resolves to its https:// URL, with `plain` also to a plain-HTTP one over the same objects (`-scheme both`, whose
 * resumable session URIs keep the scheme of the request that opened them), and a stop function. The filesystem backend fsyncs each object before answering
 * (~190 small objects/s on this machine's disk, ~1,800/s with `root` on tmpfs, where the fsync is free); the
 * memory backend scans a list of the bucket's objects on every request (~230/s at a few thousand objects).
 * Both backends read every object of the bucket for each page of a listing: O(objects) per 1,000 keys.
 * With `keep`, a filesystem root's objects are served as they are (a restarted emulator).
 */
export async function startEmulator(root, { plain = false, keep = false } = {}) {
  const port = await freePort();
  const { certFile, keyFile } = testTls();
  const argv = ["-scheme", plain ? "both" : "https", "-cert-location", certFile, "-private-key-location", keyFile];
  argv.push("-host", "127.0.0.1", "-port", String(port), "-log-level", "error");
  const plainPort = plain ? await freePort() : undefined;
  if (plainPort !== undefined) argv.push("-port-http", String(plainPort));
  if (root === undefined) argv.push("-backend", "memory");
  else {
    if (!keep) rmSync(root, { recursive: true, force: true });
    mkdirSync(root, { recursive: true });
    argv.push("-backend", "filesystem", "-filesystem-root", root);
  }
  const child = spawn(FAKE_GCS, argv, { stdio: ["ignore", "ignore", "inherit"] });
  const url = `https://127.0.0.1:${port}`;
  const plainUrl = plainPort === undefined ? undefined : `http://127.0.0.1:${plainPort}`;
  const running = () => child.exitCode === null && child.signalCode === null;
  const exited = new Promise((done) => child.once("exit", done));
  const stop = () => running() && child.kill("SIGTERM");
  // However the benchmark ends (done, failed, or killed: see below), the emulator goes, and its folder after
  // it. 'exit' cannot wait: SIGKILL, as its objects are dropped anyway and nothing of it may write once the
  // folder is being removed.
  process.on("exit", () => {
    if (running()) child.kill("SIGKILL");
    if (root !== undefined) rmSync(root, { recursive: true, force: true });
  });
  // Killed, the benchmark stops the emulator and waits for it (at most 5 s), then exits through the above with
  // the shell's code for that signal. Once this emulator has exited, the handlers go with it: a later emulator's
  // own must be the ones that wait (bench/gcs.mjs stops the one that took the source and starts another).
  const handlers = ["SIGINT", "SIGTERM"].map((signal) => {
    const handler = async () => {
      stop();
      await Promise.race([exited, new Promise((r) => setTimeout(r, 5_000))]);
      process.exit(128 + os.constants.signals[signal]);
    };
    process.once(signal, handler);
    return [signal, handler];
  });
  child.once("exit", () => {
    for (const [signal, handler] of handlers) process.off(signal, handler);
  });
  for (let i = 0; i < 300; i++) {
    const ready = (await answersOk(`${url}/storage/v1/b`)) && (plainUrl === undefined || (await answersOk(`${plainUrl}/storage/v1/b`)));
    if (ready) return { url, ...(plainUrl ? { plainUrl } : {}), stop, exited, pid: child.pid };
    await new Promise((r) => setTimeout(r, 100));
  }
  stop();
  throw new Error("fake-gcs-server did not answer within 30 s");
}

/**
 * Stops `child` when this process exits (with `atExit`: nginx's master takes SIGTERM to stop its workers, which
 * SIGKILL would leave running).
 */
function stopWithUs(child, atExit = "SIGKILL") {
  const running = () => child.exitCode === null && child.signalCode === null;
  process.on("exit", () => running() && child.kill(atExit));
  const exited = new Promise((done) => child.once("exit", done));
  return { stop: () => running() && child.kill("SIGTERM"), exited };
}

/** nginx's path, or undefined when it is not installed (the TLS row of bench/gcs.mjs is then skipped). */
export function nginxPath() {
  for (const p of ["/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx"]) {
    if (spawnSync(p, ["-v"], { stdio: "ignore" }).status === 0) return p;
  }
  return undefined;
}

/**
 * nginx terminating TLS (the tests' loopback certificate) in front of a plain-HTTP emulator, so that a client's
 * HTTPS is served by a TLS stack TensorStore's curl works with (fake-gcs-server's own stalls it, issue 25) and
 * the emulator's CPU stays the same on both sides. One worker, nothing buffered in either direction, kept-alive
 * upstream connections; a resumable session's Location (http://, from the emulator) goes back to the client as
 * https:// (`proxy_redirect`), so that every chunk stays on TLS. Directives: https://nginx.org/en/docs/http/ngx_http_proxy_module.html
 * and https://nginx.org/en/docs/http/ngx_http_ssl_module.html. Resolves to its https:// URL and a stop function.
 */
export async function startTlsTerminator(plainUrl, nginx = nginxPath()) {
  const port = await freePort();
  const { certFile, keyFile } = testTls();
  const dir = mkdtempSync(join(os.tmpdir(), "orbax2reg-bench-nginx-"));
  const up = new URL(plainUrl);
  const conf = `daemon off;
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  client_max_body_size 0;
  keepalive_requests 100000;
  keepalive_timeout 120s;
  upstream emulator { server ${up.host}; keepalive 256; }
  server {
    listen 127.0.0.1:${port} ssl;
    ssl_certificate ${certFile};
    ssl_certificate_key ${keyFile};
    ssl_protocols TLSv1.2 TLSv1.3;
    # AES-128-GCM first, whatever the client prefers: the cipher the floor in bench/gcs.mjs is measured for.
    ssl_prefer_server_ciphers on;
    ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256;
    location / {
      proxy_pass http://emulator;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_request_buffering off;
      proxy_buffering off;
      # Unbuffered, nginx passes on what one read from the emulator got, at most proxy_buffer_size (one 4 KiB
      # page by default): every download reached the client as 4 KiB TLS records, a quarter of TLS's largest,
      # which a server sending bulk data does not use (nginx's own ssl_buffer_size is 16k "for big responses").
      # 64k lets nginx write full 16 KiB records; the proxy_buffers lines only satisfy nginx's checks of it.
      proxy_buffer_size 64k;
      proxy_buffers 4 64k;
      proxy_busy_buffers_size 64k;
      client_body_buffer_size 64k;
      proxy_read_timeout 300s;
      proxy_send_timeout 300s;
      proxy_redirect http:// https://;
    }
  }
}
`;
  writeFileSync(join(dir, "nginx.conf"), conf);
  const child = spawn(nginx, ["-p", dir, "-c", join(dir, "nginx.conf")], { stdio: ["ignore", "ignore", "inherit"] });
  const { stop } = stopWithUs(child, "SIGTERM");
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  const url = `https://127.0.0.1:${port}`;
  for (let i = 0; i < 100; i++) {
    if (await answersOk(`${url}/storage/v1/b`)) return { url, stop, pid: child.pid };
    await new Promise((r) => setTimeout(r, 100));
  }
  stop();
  throw new Error("nginx (TLS in front of the emulator) did not answer within 10 s");
}

/**
 * bench/delay-proxy.mjs in a process of its own, in front of a plain-HTTP emulator: every answer held `ms`.
 * Resolves to its URL, stats() (requests by kind and the most in flight since the last reset()), and stop.
 */
export async function startDelayProxy(plainUrl, ms) {
  const child = spawn(process.execPath, [fileURLToPath(new URL("./delay-proxy.mjs", import.meta.url)), plainUrl, String(ms)], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const { stop } = stopWithUs(child);
  const first = await new Promise((done, fail) => {
    createInterface({ input: child.stdout }).once("line", done);
    child.once("exit", () => fail(new Error("the delay proxy exited before it listened")));
  });
  const { url } = JSON.parse(first);
  return {
    url,
    stats: () => api(`${url}/__stats`),
    log: () => api(`${url}/__log`),
    reset: () => api(`${url}/__reset`),
    stop,
    pid: child.pid,
  };
}

async function api(url, init = {}) {
  const r = await fetch(url, init);
  if (!r.ok && r.status !== 404) throw new Error(`${init.method ?? "GET"} ${url}: HTTP ${r.status} ${await r.text()}`);
  return r.status === 204 || r.status === 404 ? undefined : r.json();
}

/**
 * An emulator over `root` (plain HTTP too) holding `files` (local path -> object name) in bucket `bucket`, and the
 * empty buckets `others`: uploaded by an emulator that is then stopped, and served by a fresh one over the same
 * folder. After taking a large object (the benchmark step's 1.4 GB data file) the emulator that took it spent a
 * core on its own memory for the next half minute or more: the first run after the upload took 35-37 s at 30 ms a
 * request, for either client, the next ones 10-12 s. Resolves to the fresh emulator and the upload's seconds.
 */
export async function emulatorHolding(root, bucket, files, others = []) {
  const loader = await startEmulator(root, { plain: true });
  for (const b of [bucket, ...others]) await createBucket(loader.plainUrl, b);
  const t0 = performance.now();
  for (const [path, name] of files) await upload(loader.plainUrl, bucket, name, path);
  const seconds = (performance.now() - t0) / 1000;
  loader.stop();
  await loader.exited;
  return { emulator: await startEmulator(root, { plain: true, keep: true }), seconds };
}

export const createBucket = (gcs, name) =>
  api(`${gcs}/storage/v1/b?project=bench`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ name }),
  });

/** Streams a file (or bytes) into an object (uploadType=media). */
export function upload(gcs, bucket, name, fileOrBytes) {
  return new Promise((done, fail) => {
    const u = new URL(`${gcs}/upload/storage/v1/b/${bucket}/o?uploadType=media&name=${encodeURIComponent(name)}`);
    const bytes = typeof fileOrBytes === "string" ? undefined : fileOrBytes;
    const secure = u.protocol === "https:";
    const req = (secure ? httpsRequest : httpRequest)(
      {
        ...(secure ? clientTls() : {}),
        host: u.hostname,
        port: u.port,
        method: "POST",
        path: `${u.pathname}${u.search}`,
        headers: { "content-type": "application/octet-stream", "content-length": bytes?.length ?? statSync(fileOrBytes).size },
      },
      (res) => {
        res.resume();
        res.on("end", () => (res.statusCode === 200 ? done() : fail(new Error(`upload of ${name}: HTTP ${res.statusCode}`))));
      },
    );
    req.on("error", fail);
    if (bytes !== undefined) req.end(bytes);
    else createReadStream(fileOrBytes).pipe(req);
  });
}

/** Server-side copy of one object (objects.copy): how a 1,000-step root is made without 1,000 uploads' bytes. */
export const copyObject = (gcs, bucket, from, to) =>
  api(`${gcs}/storage/v1/b/${bucket}/o/${encodeURIComponent(from)}/copyTo/b/${bucket}/o/${encodeURIComponent(to)}`, { method: "POST" });

export async function listObjects(gcs, bucket, prefix) {
  const out = [];
  let pageToken;
  do {
    const q = new URLSearchParams({ prefix, maxResults: "1000", ...(pageToken ? { pageToken } : {}) });
    const page = await api(`${gcs}/storage/v1/b/${bucket}/o?${q}`);
    for (const o of page?.items ?? []) out.push(o);
    pageToken = page?.nextPageToken;
  } while (pageToken);
  return out;
}

export const deleteObject = (gcs, bucket, name) => api(`${gcs}/storage/v1/b/${bucket}/o/${encodeURIComponent(name)}`, { method: "DELETE" });

/** Deletes every object under `prefix`, 16 at once. */
export const deletePrefix = async (gcs, bucket, prefix) =>
  each(await listObjects(gcs, bucket, prefix), 16, (o) => deleteObject(gcs, bucket, o.name));

/** `fn` over `items`, `limit` at once. */
export async function each(items, limit, fn) {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (next < items.length) await fn(items[next++]);
    }),
  );
}
