/**
 * Structured logs for Cloud Logging: one JSON object per line on stdout, with `severity` and `message`
 * (which Cloud Logging lifts into the entry) and any fields (step, group, bytes, MB/s) beside them.
 */
export type Severity = "DEBUG" | "INFO" | "NOTICE" | "WARNING" | "ERROR";

export interface Logger {
  log(severity: Severity, message: string, fields?: Record<string, unknown>): void;
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
  /** A logger whose lines all carry `fields` as well. */
  with(fields: Record<string, unknown>): Logger;
}

export function jsonLogger(
  base: Record<string, unknown> = {},
  write: (line: string) => void = (l) => process.stdout.write(`${l}\n`),
): Logger {
  const log = (severity: Severity, message: string, fields: Record<string, unknown> = {}) =>
    write(JSON.stringify({ severity, message, ...base, ...fields, time: new Date().toISOString() }));
  return {
    log,
    info: (m, f) => log("INFO", m, f),
    warn: (m, f) => log("WARNING", m, f),
    error: (m, f) => log("ERROR", m, f),
    with: (fields) => jsonLogger({ ...base, ...fields }, write),
  };
}
