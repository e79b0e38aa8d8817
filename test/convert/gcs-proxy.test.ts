// A gs:// to gs:// conversion behind a forward proxy, as on a corporate network: HTTPS_PROXY and NO_PROXY (either
// case) apply to storage requests as google-auth-library applies them to its token requests, to every host NO_PROXY
// does not name, loopback included (as curl and undici do). The real CLI runs as a child process, as a user runs
// it, against fake-gcs-server over HTTPS; the proxy is the `proxy` package (test/helpers/connect-proxy.ts).
import { gaxios } from "google-auth-library";
import { afterAll, beforeAll, describe, expect, inject, test } from "vitest";
import { verify } from "../../src/convert/verify.js";
import { runBinAsync } from "../helpers/cli.js";
import { type ConnectProxy, startConnectProxy } from "../helpers/connect-proxy.js";
import { fixtureCase } from "../helpers/convert.js";
import { newBucket, uploadDir } from "../helpers/gcs.js";

const emulator = new URL(inject("gcsEndpoint"));

/** The proxy settings of a child's environment, exactly these (the machine's own, in either case, cleared). */
const proxyEnv = (o: { httpsProxy?: string; noProxy?: string }) => ({
  HTTPS_PROXY: o.httpsProxy ?? "",
  https_proxy: o.httpsProxy ?? "",
  HTTP_PROXY: "",
  http_proxy: "",
  NO_PROXY: o.noProxy ?? "",
  no_proxy: o.noProxy ?? "",
});

/** `f` with process.env's proxy settings exactly `env` for its duration (gaxios reads them on every request). */
async function withProxyEnv<T>(env: Record<string, string>, f: () => Promise<T>): Promise<T> {
  const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  Object.assign(process.env, env);
  try {
    return await f();
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

describe("the reference: google-auth-library's HTTP client (gaxios, what its token requests go through)", () => {
  let proxy: ConnectProxy;
  beforeAll(async () => {
    proxy = await startConnectProxy();
  });
  afterAll(() => proxy?.close());
  const list = () => gaxios.request({ url: `${emulator.origin}/storage/v1/b?project=test-project`, retry: false });

  test("goes to a loopback emulator through the proxy's CONNECT tunnel with HTTPS_PROXY set", async () => {
    const r = await withProxyEnv(proxyEnv({ httpsProxy: proxy.url }), list);
    expect(r.status).toBe(200);
    expect(proxy.tunnels).toEqual([emulator.host]);
  });

  test("goes around it when NO_PROXY names the emulator's host", async () => {
    const before = proxy.tunnels.length;
    const r = await withProxyEnv(proxyEnv({ httpsProxy: proxy.url, noProxy: emulator.hostname }), list);
    expect(r.status).toBe(200);
    expect(proxy.tunnels.length).toBe(before);
  });
});

describe("a gs:// conversion with HTTPS_PROXY set", () => {
  const multiprocess = fixtureCase("multiprocess");
  let src: string;
  let dst: string;
  let proxy: ConnectProxy;

  beforeAll(async () => {
    src = await newBucket("src");
    dst = await newBucket("dst");
    await uploadDir(multiprocess.location, src, "ckpts/step_00000100");
    proxy = await startConnectProxy();
  }, 120_000);
  afterAll(() => proxy?.close());

  test("goes through the proxy's CONNECT tunnels to the emulator, and the result verifies", async () => {
    const r = await runBinAsync(
      ["convert", `gs://${src}/ckpts/step_00000100`, `gs://${dst}/proxied`, "--json"],
      proxyEnv({ httpsProxy: proxy.url }),
    );
    expect(r.stderr).not.toMatch(/orbax2reg:/);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ committed: true });
    expect(proxy.tunnels.length).toBeGreaterThan(0);
    expect(new Set(proxy.tunnels)).toEqual(new Set([emulator.host]));
    const v = await verify(`gs://${src}/ckpts/step_00000100`, `gs://${dst}/proxied/step_00000100`);
    expect(v.failed).toBe(0);
  });

  test("with NO_PROXY naming the emulator's host, goes around the proxy", async () => {
    const before = proxy.tunnels.length;
    const r = await runBinAsync(
      ["convert", `gs://${src}/ckpts/step_00000100`, `gs://${dst}/direct`, "--json"],
      proxyEnv({ httpsProxy: proxy.url, noProxy: emulator.hostname }),
    );
    expect(r.stderr).not.toMatch(/orbax2reg:/);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ committed: true });
    expect(proxy.tunnels.length).toBe(before);
    expect(proxy.relayed).toEqual([]);
  });
});
