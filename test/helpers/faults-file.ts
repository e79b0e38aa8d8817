import { renameSync, writeFileSync } from "node:fs";

/**
 * Replaces the connector hook's faults file (test/e2e/connector-hook.mjs reads it on every call, E2E_FAULTS) in one
 * step: written beside it, then renamed over it. A plain rewrite truncates first, and a hook reading in between
 * parsed an empty file and failed the call it was faulting nothing in.
 */
export function writeFaults(file: string, faults: unknown[]): void {
  const next = `${file}.${process.pid}.next`;
  writeFileSync(next, JSON.stringify(faults));
  renameSync(next, file);
}
