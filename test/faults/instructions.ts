// A proxy on loopback in front of Google's storage-testbench that makes the testbench itself inject faults: a
// seeded fraction of requests gets an instruction, chosen by what the request is (downloads get download
// faults, uploads upload faults, any request a 503 or a reset). The testbench acts on two kinds of instruction
// (its README, "Force Failures" and "Retry Test API"):
// - the `x-goog-emulator-instructions` header, for the few faults it implements that way;
// - a Retry Test (POST /retry_test, one instruction for one JSON API method) named by `x-retry-test-id`,
//   for the rest (return-503, return-reset-connection, return-503-after-NK, stall-for-Ns-after-NK).
// Requests and answers are streamed through untouched otherwise; a connection the testbench cuts is cut on the
// client's side too, and close() cuts everything still open. HTTPS on both sides, as in front of GCS: it
// terminates TLS toward the product (the test CA's loopback certificate) and speaks TLS to the testbench.
//
// Resumable upload sessions always come through here, and the testbench gets one request of a session at a
// time. GCS takes a session's requests one after another; the testbench runs them on parallel threads over one
// unlocked Upload, so the copy of a chunk a client gave up waiting for, still being read when the client asks
// what was persisted and sends that chunk again, is appended a second time, and the object replaced by one
// that is too long (reproduced with raw sockets: test/faults/sessions.test.ts).
// Here a session's next request waits until the testbench has answered the last one, or was cut off before it
// had that request's whole body (then it stores none of it).
import type { ClientRequest, IncomingMessage, ServerResponse } from "node:http";
import { request } from "node:https";
import { prng } from "../helpers/prng.js";
import { httpsServer, type Listening, listenOnLoopback, upstreamTls, viaProxy } from "./loopback.js";

/** An instruction, and how the testbench takes it. */
interface Instruction {
  readonly name: string;
  readonly via: "header" | "retry-test";
  /** Whether it applies to this request (some are only implemented for some requests). */
  readonly fits?: (r: IncomingMessage) => boolean;
  /** false: only given when asked for by name (`only`). */
  readonly mix?: boolean;
}

/** A GET of bytes from an object's first byte (no Range, or one from 0). */
const fromStart = (r: IncomingMessage) => r.headers.range === undefined || /^bytes=0-/.test(r.headers.range);

export const INSTRUCTIONS = {
  download: [
    // Resets the connection after 1 MiB (sent at 640 KiB/s); a smaller answer arrives whole, only slowly.
    { name: "return-broken-stream", via: "header" },
    // Resets the connection after 256 KiB. Only from the first byte: to a Range from elsewhere the testbench
    // answers 200 with the range's bytes alone, which no client can tell from a short whole object.
    { name: "return-503-after-256K", via: "header", fits: fromStart },
    // Stalls before the first byte (the stall timeout retries it). Only for whole-object GETs: the testbench's
    // stalled answer loses a 206's status, and it sends 4 bytes at a time, too slow for a chunk.
    { name: "stall-for-3s-after-0K", via: "retry-test", fits: (r) => r.headers.range === undefined },
  ],
  upload: [
    // Damages the media of a one-shot upload before it is stored: refused for its CRC-32C or, for a streamed
    // upload that carried none, stored with a CRC-32C that is not the one sent. Not in the random mix: the
    // testbench refuses a CRC-32C mismatch with 412 (GCS: 400), which GcsStore takes for a failed precondition
    // (see the skipped test in testbench.test.ts).
    { name: "inject-upload-data-error", via: "header", fits: (r) => r.method === "POST", mix: false },
    // Answers 503 once 64 KiB of the upload have arrived, storing nothing.
    { name: "return-503-after-64K", via: "retry-test" },
    // A resumable upload's chunk: 503 after 256 KiB of it.
    { name: "return-503-after-256K", via: "header", fits: (r) => r.method === "PUT" },
  ],
  any: [
    { name: "return-503", via: "retry-test" },
    { name: "return-reset-connection", via: "retry-test" },
  ],
} satisfies Record<string, Instruction[]>;

export interface InstructionProxyOptions {
  readonly upstream: string;
  readonly seed: number;
  /** The fraction of requests given an instruction. */
  readonly rate: number;
  /** Only these instructions (by name), instead of the mix. */
  readonly only?: readonly string[];
  /** Relay the testbench's injected error bodies as they are (see flattened()). */
  readonly rawErrors?: boolean;
  /** At most this many instructions in all. */
  readonly limit?: number;
  /** Give resumable upload chunks (PUT) instructions too; otherwise they are relayed untouched. */
  readonly instructChunks?: boolean;
  /** Pass over the first this many requests an instruction would be given to (to fault the middle of an upload). */
  readonly skip?: number;
}

export interface InstructionProxy {
  readonly url: string;
  /** Requests seen, instructions given by name, and the bytes of upload bodies relayed to the testbench. */
  readonly stats: { requests: number; instructed: Record<string, number>; uploadBytes: number };
  close(): Promise<void>;
}

/** The JSON API method the testbench's Retry Test API files a request under, if it is one we instruct. */
function methodOf(r: IncomingMessage): string | undefined {
  const url = r.url ?? "/";
  if (url.startsWith("/upload/storage/v1/b/") && (r.method === "POST" || r.method === "PUT")) return "storage.objects.insert";
  if (!url.startsWith("/storage/v1/b/")) return undefined;
  if (/^\/storage\/v1\/b\/[^/]+\/o(\?|$)/.test(url)) return r.method === "GET" ? "storage.objects.list" : undefined;
  if (/^\/storage\/v1\/b\/[^/]+\/o\/[^/?]+/.test(url)) {
    if (r.method === "GET") return "storage.objects.get";
    if (r.method === "DELETE") return "storage.objects.delete";
  }
  return undefined;
}

/** The resumable upload session a request is to (its chunks and status queries), if any. */
const sessionOf = (r: IncomingMessage): string | undefined =>
  new URL(r.url ?? "/", "http://proxy").searchParams.get("upload_id") ?? undefined;

const isDownload = (r: IncomingMessage) => r.method === "GET" && /[?&]alt=media\b/.test(r.url ?? "");

export async function startInstructionProxy(o: InstructionProxyOptions): Promise<InstructionProxy> {
  const upstream = new URL(o.upstream);
  const random = prng(o.seed);
  const stats = { requests: 0, instructed: {} as Record<string, number>, uploadBytes: 0 };
  let given = 0;
  let skipped = 0;
  let self = ""; // this proxy's URL, once it listens

  /** One draw for whether, one for which: the sequence depends only on the seed and the request order. */
  const pick = (r: IncomingMessage): Instruction | undefined => {
    if (sessionOf(r) !== undefined && !o.instructChunks) return undefined;
    const method = methodOf(r);
    const [x, y] = [random(), random()];
    if (method === undefined || x >= o.rate || given >= (o.limit ?? Number.POSITIVE_INFINITY)) return undefined;
    const own = method === "storage.objects.insert" ? INSTRUCTIONS.upload : isDownload(r) ? INSTRUCTIONS.download : [];
    const chosen = (i: Instruction) => (o.only ? o.only.includes(i.name) : i.mix !== false);
    const fitting = [...own, ...INSTRUCTIONS.any].filter((i: Instruction) => chosen(i) && (i.fits?.(r) ?? true));
    const instruction = fitting[Math.floor(y * fitting.length)];
    if (instruction !== undefined && skipped < (o.skip ?? 0)) return void skipped++;
    if (instruction !== undefined) given++;
    return instruction;
  };

  const retryTest = async (method: string, instruction: string): Promise<string> => {
    const a = await fetch(`${o.upstream}/retry_test`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ instructions: { [method]: [instruction] }, transport: "HTTP" }),
    });
    if (!a.ok) throw new Error(`storage-testbench refused a Retry Test: HTTP ${a.status} ${await a.text()}`);
    return ((await a.json()) as { id: string }).id;
  };

  /** Per upload session, when its last request is over at the testbench: the next one is sent after. */
  const sessions = new Map<string, Promise<void>>();
  /** Waits for the session's turn (at once for a request of no session); resolves with the call that ends it. */
  const turn = async (r: IncomingMessage): Promise<() => void> => {
    const id = sessionOf(r);
    if (id === undefined) return () => {};
    const before = sessions.get(id) ?? Promise.resolve();
    let over!: () => void;
    const mine = new Promise<void>((resolve) => (over = resolve));
    sessions.set(id, mine);
    void mine.then(() => sessions.get(id) === mine && sessions.delete(id));
    await before;
    return over;
  };

  let listening: Listening | undefined; // set before the first request can come
  /** Requests to the testbench not over yet: close() cuts them too, as it cuts the clients' connections. */
  const ups = new Set<ClientRequest>();
  const server = httpsServer((req: IncomingMessage, res: ServerResponse) => {
    stats.requests++;
    req.pause(); // until the instruction is in place and, in a session, the previous request is over
    const cut = () => listening?.reset(req.socket);
    const instruction = pick(req);
    const headers: Record<string, string | string[] | undefined> = { ...req.headers, host: upstream.host };
    const ready = async () => {
      if (instruction === undefined) return;
      stats.instructed[instruction.name] = (stats.instructed[instruction.name] ?? 0) + 1;
      if (instruction.via === "header") headers["x-goog-emulator-instructions"] = instruction.name;
      else headers["x-retry-test-id"] = await retryTest(methodOf(req) as string, instruction.name);
    };
    const session = sessionOf(req) !== undefined;
    // The client may let go at any time, also while its request waits for the session's turn or for its Retry
    // Test: listened for from the start, since a request sent on after that would open a connection to the
    // testbench that nothing ever finishes, and gunicorn holds a thread on each such connection, with no deadline
    // (16 of them stopped it for every test after: docs/testing.md).
    let up: ClientRequest | undefined;
    let answered: IncomingMessage | undefined;
    let gone = false;
    // The client gave up before its whole body came: the testbench must not wait for the rest (pipe() neither
    // ends nor destroys `up` when `req` is cut off).
    req.on("close", () => {
      if (req.complete) return;
      gone = true;
      up?.destroy();
    });
    // The client let go (its stall timeout, a cancelled read): so does the proxy, but for a session's request
    // whose whole body the testbench has: that one runs to its end before the next is sent.
    res.on("close", () => {
      if (res.writableFinished) return;
      gone = true;
      if (session && up?.writableFinished) return void answered?.unpipe(res).resume();
      up?.destroy();
    });
    void turn(req).then(async (over) => {
      try {
        await ready();
      } catch {
        over();
        return cut();
      }
      if (gone) return over(); // nothing of it is sent
      up = request(
        // A connection of its own for each request: the testbench (gunicorn) answers an instructed upload before it
        // has read the body, and a kept-alive connection then had the rest of that body read as the next request's
        // line ("Invalid HTTP method", "Request Line is too large"). GCS frames requests itself; this proxy must not
        // add a misframing of its own.
        { ...upstreamTls(), agent: false, host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers },
        (answer) => {
          answered = answer;
          answer.on("close", over);
          // The client gave up before the answer came: it is read and dropped (see res's close above).
          if (res.destroyed || gone) return void answer.resume();
          if (!o.rawErrors && instruction?.via === "retry-test" && (answer.statusCode ?? 0) >= 400) return flattened(answer, res);
          // A resumable upload's session URI names the testbench: made to name this proxy, so that chunks come here.
          const location = viaProxy(answer.headers.location, upstream, self);
          if (location !== undefined) answer.headers.location = location;
          res.writeHead(answer.statusCode ?? 502, answer.headers);
          answer.pipe(res);
          // The testbench cut the connection mid-answer: so does the proxy, so the client sees a reset too.
          answer.on("aborted", cut);
          answer.on("error", cut);
        },
      );
      const mine = up;
      ups.add(mine);
      mine.on("close", () => {
        ups.delete(mine);
        if (answered === undefined) over(); // no answer will come
      });
      mine.on("error", cut);
      if (methodOf(req) === "storage.objects.insert") req.on("data", (p: Buffer) => (stats.uploadBytes += p.length));
      req.pipe(mine);
    });
  });
  listening = await listenOnLoopback(server, "instruction proxy");
  self = listening.url;
  const { close } = listening;
  return {
    url: self,
    stats,
    close: () => {
      for (const u of ups) u.destroy();
      return close();
    },
  };
}

/**
 * A Retry Test's injected error, in GCS's own shape. GCS's error body has a string `error.message`
 * (https://cloud.google.com/storage/docs/json_api/v1/status-codes); the testbench's injected ones nest a whole
 * `{"error": {"message": ...}}` object there, on which src/store/http.ts fails with a TypeError today (see the
 * skipped test in testbench.test.ts): the inner message is lifted out.
 */
function flattened(answer: IncomingMessage, res: ServerResponse): void {
  const pieces: Buffer[] = [];
  answer.on("data", (p: Buffer) => pieces.push(p));
  answer.on("end", () => {
    let body = Buffer.concat(pieces);
    try {
      const e = (JSON.parse(body.toString()) as { error?: { code?: unknown; message?: unknown } }).error;
      let message = e?.message;
      while (message !== null && typeof message === "object") message = (message as { error?: { message?: unknown } }).error?.message;
      if (e !== undefined && typeof e.message !== "string") {
        body = Buffer.from(JSON.stringify({ error: { code: answer.statusCode, message: String(message) } }));
      }
    } catch {
      // not JSON: relayed as it is
    }
    const headers = { ...answer.headers, "content-length": String(body.length) };
    delete headers["transfer-encoding"];
    res.writeHead(answer.statusCode ?? 502, headers);
    res.end(body);
  });
}
