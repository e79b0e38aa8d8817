// Small helpers for the tests' local servers (fake-gcs-server, emulators): free ports, installed binaries.
import { existsSync } from "node:fs";
import { createServer } from "node:net";

/** A TCP port on loopback nobody listens on right now. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === "object" && addr ? resolve(addr.port) : reject(new Error("no port"))));
    });
  });
}

/** Fails with the fix when something scripts/install.sh installs is missing. */
export function need(path: string): void {
  if (!existsSync(path)) throw new Error(`${path} is missing: run scripts/install.sh first`);
}
