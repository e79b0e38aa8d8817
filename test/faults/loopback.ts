// What the fault proxies (proxy.ts, in front of fake-gcs-server; instructions.ts, in front of the
// storage-testbench) share: listening on loopback with every connection tracked, so that close() cuts what is
// still open, and the resumable upload session URIs that must name the proxy for chunks to pass through it.
import type { Server } from "node:http";
import type { Socket } from "node:net";

export interface Listening {
  readonly url: string;
  /** Cuts every connection still open and stops listening. */
  close(): Promise<void>;
}

/** `server` on 127.0.0.1, on a free port. */
export async function listenOnLoopback(server: Server, name: string): Promise<Listening> {
  const sockets = new Set<Socket>();
  server.on("connection", (s: Socket) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  server.keepAliveTimeout = 5_000;
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  if (typeof address !== "object" || address === null) throw new Error(`${name}: no address`);
  return {
    url: `http://127.0.0.1:${address.port}`,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** A Location that names the upstream server (an upload session's URI), made to name the proxy at `self`. */
export function viaProxy(location: string | undefined, upstream: URL, self: string): string | undefined {
  return location?.startsWith(upstream.origin) ? self + location.slice(upstream.origin.length) : location;
}
