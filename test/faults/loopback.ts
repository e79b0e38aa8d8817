// What the fault proxies (proxy.ts, in front of fake-gcs-server; instructions.ts, in front of the
// storage-testbench) share: serving HTTPS on loopback with the test CA's certificate (test/helpers/tls.mjs), as GCS
// does, with every connection tracked, so that close() cuts what is still open and a fault can reset one; the TLS
// options of their requests to the emulator behind them (HTTPS too); and the resumable upload session URIs that must
// name the proxy for chunks to pass through it.
import type { IncomingMessage, ServerResponse } from "node:http";
import { createServer as createHttpsServer, type RequestOptions, type Server } from "node:https";
import type { Socket } from "node:net";
import { clientTls, serverTls } from "../helpers/tls.mjs";

export interface Listening {
  readonly url: string;
  /**
   * Resets the TCP connection under `socket` (a request's TLS socket): an RST, as a network fault looks. A TLS
   * socket cannot send one itself (resetAndDestroy needs the TCP handle), so it is the raw socket under it.
   */
  reset(socket: Socket): void;
  /** Cuts every connection still open and stops listening. */
  close(): Promise<void>;
}

/** An HTTPS server with the loopback certificate, answering with `handler`. */
export const httpsServer = (handler: (req: IncomingMessage, res: ServerResponse) => void): Server =>
  createHttpsServer(serverTls(), handler);

/** What a proxy's request to the emulator behind it adds: trust in the test CA (the emulators serve HTTPS). */
export const upstreamTls = (): Pick<RequestOptions, "ca"> => clientTls();

/** `server` on 127.0.0.1, on a free port. */
export async function listenOnLoopback(server: Server, name: string): Promise<Listening> {
  // By the client's port: on loopback, one connection each. 'connection' gives the TCP socket, before TLS.
  const sockets = new Map<number, Socket>();
  server.on("connection", (s: Socket) => {
    const port = s.remotePort as number;
    sockets.set(port, s);
    s.on("close", () => sockets.get(port) === s && sockets.delete(port));
  });
  server.keepAliveTimeout = 5_000;
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  if (typeof address !== "object" || address === null) throw new Error(`${name}: no address`);
  return {
    url: `https://127.0.0.1:${address.port}`,
    reset: (socket) => {
      const raw = socket.remotePort === undefined ? undefined : sockets.get(socket.remotePort);
      if (raw !== undefined && !raw.destroyed) raw.resetAndDestroy();
      else socket.destroy();
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets.values()) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** A Location that names the upstream server (an upload session's URI), made to name the proxy at `self`. */
export function viaProxy(location: string | undefined, upstream: URL, self: string): string | undefined {
  return location?.startsWith(upstream.origin) ? self + location.slice(upstream.origin.length) : location;
}
