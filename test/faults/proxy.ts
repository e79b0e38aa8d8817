// A fault-injecting HTTPS proxy on loopback, in front of fake-gcs-server: the product is pointed at it through
// ORBAX2REG_GCS_ENDPOINT and sees the faults a real network and a busy GCS produce. It terminates TLS toward the
// product (the test CA's loopback certificate) and speaks TLS to the emulator behind it, so the product's TLS
// layer meets every fault, as it would on a real network. Faults are drawn from a
// seeded PRNG (the same seed, the same faults for the same request sequence) or forced by rules; every fault
// is counted, every socket and timer is closed by close(), and it listens on 127.0.0.1 only.
import type { IncomingMessage, ServerResponse } from "node:http";
import { request } from "node:https";
import { prng } from "../helpers/prng.js";
import { httpsServer, type Listening, listenOnLoopback, upstreamTls, viaProxy } from "./loopback.js";

export const FAULT_KINDS = [
  "503", // answered 503 without reaching the server
  "429", // answered 429 (rate limited) without reaching the server
  "reset", // connection reset before any answer (the request may or may not have reached the server)
  "reset-mid-body", // the server's answer is relayed, then the connection is reset halfway through its body
  "truncate", // headers announce the whole body, half is sent, then the connection is closed cleanly
  "stall", // headers and half the body are sent, then nothing until the proxy is closed
  "stall-headers", // nothing at all is answered until the proxy is closed
  "corrupt-upload", // one byte of the request body is flipped on its way to the server
  "corrupt-download", // one byte of the response body is flipped on its way to the client
  "delay", // the answer is held back for `delayMs` (survivable without a retry)
  "reset-mid-upload", // half the request body is forwarded, then both connections are reset (no answer)
  "410", // answered 410 Gone without reaching the server (a resumable upload session that expired)
] as const;
export type FaultKind = (typeof FAULT_KINDS)[number];

export interface Rule {
  /** Which requests: method and path+query (e.g. /upload/..., /storage/v1/b/B/o/NAME?alt=media). */
  readonly match: (method: string, url: string) => boolean;
  readonly fault: FaultKind;
  /** At most this many times (default: always). */
  readonly times?: number;
}

export interface ProxyOptions {
  readonly upstream: string;
  readonly seed?: number;
  /** Probability of each fault per request (random draws, seeded). */
  readonly rates?: Partial<Record<FaultKind, number>>;
  /** Forced faults, checked before the random draw. */
  readonly rules?: Rule[];
  readonly delayMs?: number;
}

export interface FaultProxy {
  readonly url: string;
  /** uploadBytes: request body bytes forwarded to the server (what it received, kept or not). */
  readonly stats: { requests: number; faults: Record<string, number>; uploadBytes: number };
  /** Every request seen: method, path and query, Range and Content-Range headers. */
  readonly log: { method: string; url: string; range?: string; contentRange?: string }[];
  /** Requests whose answer has not finished or been cut: 0 once the client has let go of everything. */
  inFlight(): number;
  /** Replaces the rules and rates (between phases of a test). */
  configure(o: { rates?: Partial<Record<FaultKind, number>>; rules?: Rule[] }): void;
  close(): Promise<void>;
}

export async function startFaultProxy(o: ProxyOptions): Promise<FaultProxy> {
  const upstream = new URL(o.upstream);
  const random = prng(o.seed ?? 1);
  let rates = o.rates ?? {};
  let rules = (o.rules ?? []).map((r) => ({ ...r, left: r.times ?? Number.POSITIVE_INFINITY }));
  const stats = { requests: 0, faults: {} as Record<string, number>, uploadBytes: 0 };
  // What the server confirmed of each resumable upload session (its last 308's Range), by upload_id.
  const kept = new Map<string, string | undefined>();
  const log: { method: string; url: string; range?: string; contentRange?: string }[] = [];
  const timers = new Set<NodeJS.Timeout>();
  const open = new Set<ServerResponse>();

  const pick = (method: string, url: string): FaultKind | undefined => {
    for (const r of rules) {
      if (r.left > 0 && r.match(method, url)) {
        r.left--;
        return r.fault;
      }
    }
    const x = random(); // one draw per request, so the sequence depends only on the seed and the request order
    let acc = 0;
    for (const kind of FAULT_KINDS) {
      acc += rates[kind] ?? 0;
      if (x < acc) return kind;
    }
    return undefined;
  };

  const later = (ms: number, f: () => void) => {
    const t = setTimeout(() => {
      timers.delete(t);
      f();
    }, ms);
    timers.add(t);
  };

  let listening: Listening | undefined; // set before the first request can come
  const server = httpsServer((req: IncomingMessage, res: ServerResponse) => {
    stats.requests++;
    log.push({
      method: req.method ?? "GET",
      url: req.url ?? "/",
      ...(req.headers.range ? { range: req.headers.range } : {}),
      ...(req.headers["content-range"] ? { contentRange: req.headers["content-range"] } : {}),
    });
    open.add(res);
    const done = () => open.delete(res);
    res.on("close", done);
    const fault = pick(req.method ?? "GET", req.url ?? "/");
    if (fault) stats.faults[fault] = (stats.faults[fault] ?? 0) + 1;
    const cut = () => {
      listening?.reset(req.socket);
      done();
    };

    if (fault === "503" || fault === "429" || fault === "410") {
      req.resume();
      const message = { "503": "Service Unavailable", "429": "Too Many Requests", "410": "Gone" }[fault];
      const body = JSON.stringify({ error: { code: Number(fault), message: `${message} (injected)` } });
      res.writeHead(Number(fault), { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
      res.end(body);
      return;
    }
    // fake-gcs-server finalizes a resumable upload when asked for its status (a PUT with Content-Range
    // "bytes */..."), where GCS answers 308 with what it kept: answered here from the server's last 308.
    const session = /[?&]upload_id=([^&]+)/.exec(req.url ?? "")?.[1];
    if (req.method === "PUT" && session !== undefined && /^bytes \*\//.test(String(req.headers["content-range"])) && kept.has(session)) {
      req.resume();
      const range = kept.get(session);
      res.writeHead(308, { "content-length": "0", ...(range ? { range } : {}) });
      res.end();
      return;
    }
    if (fault === "reset") return cut();
    if (fault === "stall-headers") return req.resume(); // closed by close()

    // Forward, with the whole request body in hand (test objects are small).
    const pieces: Buffer[] = [];
    req.on("data", (p: Buffer) => pieces.push(p));
    req.on("end", () => {
      const body = Buffer.concat(pieces);
      const at = fault === "corrupt-upload" ? dataOffset(body, req.headers["content-type"]) : -1;
      if (at >= 0) body.writeUInt8(body.readUInt8(at) ^ 0xff, at);
      const up = request(
        {
          ...upstreamTls(),
          host: upstream.hostname,
          port: upstream.port,
          method: req.method,
          path: req.url,
          headers: { ...req.headers, host: upstream.host },
        },
        (answer) => {
          const got: Buffer[] = [];
          answer.on("data", (p: Buffer) => got.push(p));
          answer.on("end", () => {
            const data = Buffer.concat(got);
            const headers = { ...answer.headers };
            if (session !== undefined && answer.statusCode === 308) kept.set(session, answer.headers.range);
            // An upload session's URI names the server: made to name the proxy, so that its chunks pass here too.
            const location = viaProxy(headers.location, upstream, url);
            if (location !== undefined) headers.location = location;
            const opened = /[?&]upload_id=([^&]+)/.exec(headers.location ?? "")?.[1];
            if (opened !== undefined) kept.set(opened, undefined);
            delete headers["transfer-encoding"];
            headers["content-length"] = String(data.length);
            if (res.destroyed) return;
            const half = data.subarray(0, data.length >> 1);
            if (fault === "corrupt-download" && data.length > 0) data.writeUInt8(data.readUInt8(data.length >> 1) ^ 0xff, data.length >> 1);
            switch (fault) {
              case "reset-mid-body":
                res.writeHead(answer.statusCode ?? 502, headers);
                res.write(half, () => later(20, cut));
                return;
              case "truncate":
                res.writeHead(answer.statusCode ?? 502, headers);
                res.write(half, () =>
                  later(20, () => {
                    req.socket.end();
                    done();
                  }),
                );
                return;
              case "stall":
                res.writeHead(answer.statusCode ?? 502, headers);
                res.write(half); // and nothing more until close()
                return;
              case "delay":
                later(o.delayMs ?? 100, () => {
                  res.writeHead(answer.statusCode ?? 502, headers);
                  res.end(data);
                });
                return;
              default:
                res.writeHead(answer.statusCode ?? 502, headers);
                res.end(data);
            }
          });
        },
      );
      up.on("error", () => cut());
      if (fault === "reset-mid-upload") {
        const half = body.subarray(0, body.length >> 1);
        stats.uploadBytes += half.length;
        up.write(half, () =>
          later(20, () => {
            up.destroy();
            cut();
          }),
        );
        return;
      }
      stats.uploadBytes += body.length;
      up.end(body);
    });
  });
  listening = await listenOnLoopback(server, "fault proxy");
  const { url, close } = listening;

  return {
    url,
    stats,
    log,
    inFlight: () => open.size,
    configure: (c) => {
      if (c.rates) rates = c.rates;
      if (c.rules) rules = c.rules.map((r) => ({ ...r, left: r.times ?? Number.POSITIVE_INFINITY }));
    },
    close: () => {
      for (const t of timers) clearTimeout(t);
      return close();
    },
  };
}

/** Rule helpers: requests by the kind of operation they are. */
export const isUpload = (method: string, url: string) => (method === "POST" || method === "PUT") && url.startsWith("/upload/");
/** A chunk of a resumable upload (a PUT to its session), or the status query of one. */
export const isChunk = (method: string, url: string) => method === "PUT" && url.startsWith("/upload/") && /[?&]upload_id=/.test(url);
export const isDownload = (_method: string, url: string) => /[?&]alt=media\b/.test(url);
export const isListing = (method: string, url: string) => method === "GET" && /\/o\?/.test(url) && !/alt=media/.test(url);
export const isMetadata = (method: string, url: string) => method === "GET" && /\/o\/[^?]+(\?(?!.*alt=media).*)?$/.test(url);

/**
 * Where an upload's object bytes start: in a multipart/related body, the first byte of the second part (damage
 * to the metadata part would be a different fault: a bad name, or a malformed request); otherwise the middle.
 */
function dataOffset(body: Buffer, contentType: string | undefined): number {
  const boundary = /boundary=([^;\s]+)/.exec(contentType ?? "")?.[1];
  if (boundary === undefined) return body.length > 0 ? body.length >> 1 : -1;
  const second = body.indexOf(`--${boundary}`, body.indexOf(`--${boundary}`) + 1);
  const start = second < 0 ? -1 : body.indexOf("\r\n\r\n", second) + 4;
  return start >= 4 && !body.subarray(start).toString("latin1").startsWith(`\r\n--${boundary}`) ? start : -1;
}
