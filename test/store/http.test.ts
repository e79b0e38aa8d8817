// Http.send's verdict on an answer its caller did not accept, against a stub server answering the status asked for
// (over HTTPS with the test CA's loopback certificate, as GCS answers).
import { createServer, type Server } from "node:https";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { CredentialsError, StorageIoError } from "../../src/errors.js";
import { Http, NO_CREDENTIALS } from "../../src/store/http.js";
import { TransientError, transientStatus } from "../../src/store/retry.js";
import { serverTls } from "../helpers/tls.mjs";

let server: Server;
let base: string;

beforeAll(async () => {
  server = createServer(serverTls(), (req, res) => {
    const [, status, after] = /^\/(\d+)(?:\/(\d+))?$/.exec(req.url ?? "") ?? [];
    const body = JSON.stringify({ error: { code: Number(status), message: `answered ${status}` } });
    res.writeHead(Number(status), { "content-type": "application/json", ...(after ? { "retry-after": after } : {}) }).end(body);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const a = server.address();
  base = `https://127.0.0.1:${typeof a === "object" && a ? a.port : 0}`;
});
afterAll(() => new Promise<void>((r) => server.close(() => r())));

const http = new Http(NO_CREDENTIALS, { stallMs: 5_000 });
const failure = (path: string) => http.send("GET", `${base}${path}`, { accept: [200], path: "gs://b/o" }).catch((e: unknown) => e);

describe("an answer the caller did not accept", () => {
  test.each([400, 401, 403, 404, 407, 408, 409, 412, 418, 429, 499, 500, 501, 502, 503, 504, 599])(
    "HTTP %i is transient (retried) exactly when transientStatus says so, otherwise final, with the server's message",
    async (status) => {
      const e = await failure(`/${status}`);
      if (transientStatus(status)) {
        expect(e).toBeInstanceOf(TransientError);
        expect((e as TransientError).retryKind).toBe(`http-${status}`);
      } else {
        expect(e).toBeInstanceOf(StorageIoError);
      }
      expect((e as Error).message).toContain(`HTTP ${status} (answered ${status})`);
    },
  );

  test("a transient one's Retry-After, capped at 30 s, is the least wait before the retry", async () => {
    expect(((await failure("/503/2")) as TransientError).retryAfterMs).toBe(2_000);
    expect(((await failure("/429/600")) as TransientError).retryAfterMs).toBe(30_000);
  });
});

describe("credentials", () => {
  test("no Application Default Credentials at all is said at once, not retried, with how to give some", async () => {
    const none = new Http(
      {
        headers: () =>
          Promise.reject(
            new Error(
              "Could not load the default credentials. Browse to https://cloud.google.com/docs/authentication/getting-started for more information.",
            ),
          ),
      },
      { stallMs: 5_000 },
    );
    const e = await none.send("GET", `${base}/200`, { accept: [200], path: "gs://b/o" }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(CredentialsError);
    expect((e as CredentialsError).exitCode).toBe(2);
    expect((e as Error).message).toMatch(/^gs:\/\/b\/o: no Google credentials found: run `gcloud auth application-default login`/);
  });

  test("a token that could not be fetched this time stays transient", async () => {
    const flaky = new Http({ headers: () => Promise.reject(new Error("request to metadata server timed out")) }, { stallMs: 5_000 });
    const e = await flaky.send("GET", `${base}/200`, { accept: [200], path: "gs://b/o" }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(TransientError);
  });
});
