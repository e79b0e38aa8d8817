import { printable } from "../errors.js";

/** Where CLI commands write: results to stdout, warnings and progress to stderr (so --json stays clean). */
export interface Output {
  stdout(line: string): void;
  /** Raw text for stdout/stderr (help and usage messages arrive pre-formatted). */
  writeOut(text: string): void;
  writeErr(text: string): void;
  warn(line: string): void;
  /** Whether stderr is a terminal (progress bars) or not (progress lines: progress.ts). */
  readonly isTTY: boolean;
  /**
   * stdout's width when it is a terminal, which tables fit (src/cli/format.ts); undefined for a pipe or a
   * file, where every row stays one line whatever its width.
   */
  readonly columns?: number;
}

export function processOutput(): Output {
  return {
    stdout: (line) => process.stdout.write(`${line}\n`),
    writeOut: (text) => process.stdout.write(text),
    writeErr: (text) => process.stderr.write(text),
    // A warning quotes what it is about (a key, a file's text): one printable line.
    warn: (line) => process.stderr.write(`warning: ${printable(line)}\n`),
    isTTY: process.stderr.isTTY === true,
    ...(process.stdout.isTTY === true && process.stdout.columns > 0 ? { columns: process.stdout.columns } : {}),
  };
}
