/** Where CLI commands write: results to stdout, warnings and progress to stderr (so --json stays clean). */
export interface Output {
  stdout(line: string): void;
  /** Raw text for stdout/stderr (help and usage messages arrive pre-formatted). */
  writeOut(text: string): void;
  writeErr(text: string): void;
  warn(line: string): void;
  /** Whether stderr is a terminal (progress bars) or not (JSON progress lines). */
  readonly isTTY: boolean;
  progress(label: string, total: number): Progress;
}

export interface Progress {
  update(done: number): void;
  done(): void;
}

export function processOutput(): Output {
  const tty = process.stderr.isTTY === true;
  return {
    stdout: (line) => process.stdout.write(`${line}\n`),
    writeOut: (text) => process.stdout.write(text),
    writeErr: (text) => process.stderr.write(text),
    warn: (line) => process.stderr.write(`warning: ${line}\n`),
    isTTY: tty,
    progress(label, total) {
      if (!tty) return { update() {}, done() {} };
      return {
        update: (done) => process.stderr.write(`\r${label} ${done}/${total}`),
        done: () => process.stderr.write("\r\x1b[K"),
      };
    },
  };
}
