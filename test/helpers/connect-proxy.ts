// A forward HTTP proxy on loopback, as a corporate network puts in front of Google's APIs: the `proxy` package
// (what undici's own proxy tests run), which relays https:// requests through CONNECT tunnels. It counts the
// tunnels it opened and the hosts they went to, so a test can tell a conversion went through it (HTTPS_PROXY) or
// around it (NO_PROXY). The proxy itself listens on plain HTTP, as such proxies mostly do (HTTPS_PROXY=http://...):
// what it relays is TLS from end to end, the client's to the emulator.
import { createServer, type IncomingMessage } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { createProxy } from "proxy";

export interface ConnectProxy {
  /** http://127.0.0.1:PORT, for HTTPS_PROXY. */
  readonly url: string;
  /** The CONNECT requests' targets (host:port), in order. */
  readonly tunnels: string[];
  /** Plain-HTTP requests relayed without a tunnel (http:// URLs), by URL. */
  readonly relayed: string[];
  close(): Promise<void>;
}

export async function startConnectProxy(): Promise<ConnectProxy> {
  const server = createProxy(createServer());
  const tunnels: string[] = [];
  const relayed: string[] = [];
  server.on("connect", (req: IncomingMessage) => tunnels.push(req.url ?? ""));
  server.on("request", (req: IncomingMessage) => relayed.push(req.url ?? ""));
  const sockets = new Set<Socket>();
  server.on("connection", (s: Socket) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    tunnels,
    relayed,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy(); // tunnels still open, and kept-alive connections
        server.close(() => r());
      }),
  };
}
