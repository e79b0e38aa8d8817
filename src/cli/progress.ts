import cliProgress from "cli-progress";
import { dataLength, type PlannedObject } from "../convert/plan-format.js";
import { formatBytes } from "./format.js";

/**
 * How a command shows its progress on stderr: a bar on a terminal; JSON lines with --json (for whatever reads
 * the JSON result); neither a terminal nor --json (a CI log, `| tee`), a short line now and then; nothing
 * with --no-progress.
 */
export type ProgressMode = "bar" | "json" | "lines" | "off";

export function progressMode(options: { json?: boolean; progress?: boolean }, stderrIsTTY: boolean): ProgressMode {
  if (options.progress === false) return "off";
  if (options.json) return "json";
  return stderrIsTTY ? "bar" : "lines";
}

/** How often a JSON progress line is printed (--json): often enough for a script to show a live figure. */
const JSON_EVERY_MS = 3000;

/**
 * How often a progress line is printed into a log (no terminal, no --json): a run shorter than this prints
 * none (the output stays what the docs show), a long one keeps a CI log alive (CI services end a step after
 * about 10 minutes of silence) at 2 lines a minute.
 */
export const LINE_EVERY_MS = 30_000;

/**
 * An ETA needs a rate worth the name: this long a run and this share of the bytes done. The first objects are
 * small metadata written in milliseconds (182 bytes in 0.1 s would promise weeks), and large ones arrive
 * whole, so until then the ETA is null (the bar says "…").
 */
const ETA_AFTER_MS = 5000;
const ETA_AFTER_SHARE = 0.01;

/** Seconds left at the rate so far, or null while there is no rate worth the name. */
export function eta(done: number, total: number, elapsedMs: number): number | null {
  if (done >= total) return 0;
  if (elapsedMs < ETA_AFTER_MS || done < total * ETA_AFTER_SHARE || done <= 0) return null;
  return Math.round(((total - done) * elapsedMs) / done / 1000);
}

/** True at most once per `every` ms, counting from `last` (0: the first call is due at once). */
class Every {
  constructor(
    private last: number,
    private readonly every: number,
  ) {}

  due(now = Date.now()): boolean {
    if (now - this.last < this.every) return false;
    this.last = now;
    return true;
  }
}

/** When the lines of a mode without a bar are due: JSON from the first object on, log lines after a while. */
function schedule(mode: ProgressMode, started: number, jsonAtOnce: boolean): Every | undefined {
  if (mode === "json") return new Every(jsonAtOnce ? 0 : started, JSON_EVERY_MS);
  if (mode === "lines") return new Every(started, LINE_EVERY_MS);
  return undefined;
}

/** What a conversion will write: its bytes, and how many objects each array (`gda/<path>`) has. */
export interface ProgressScope {
  readonly bytes: number;
  readonly objectsPerArray: ReadonlyMap<string, number>;
}

/** The scope of `objects`, and of more objects given later to the same scope (a part at a time). */
export function progressScope(objects: Iterable<PlannedObject>, into?: { bytes: number; objectsPerArray: Map<string, number> }) {
  const scope = into ?? { bytes: 0, objectsPerArray: new Map<string, number>() };
  for (const o of objects) {
    scope.bytes += dataLength(o.data);
    const array = arrayOf(o.target);
    scope.objectsPerArray.set(array, (scope.objectsPerArray.get(array) ?? 0) + 1);
  }
  return scope;
}

/**
 * Conversion progress (progressMode): a bar (bytes, arrays, rate, ETA); JSON lines every few seconds, the
 * first at once (a conversion may run for minutes); or a line such as "converting: 1.2 GiB of 13.5 GiB (9%),
 * 3 of 31 arrays, 81.4 MiB/s, ETA 2m25s" every LINE_EVERY_MS.
 */
export class ConvertProgress {
  private bytes = 0;
  private arraysDone = 0;
  private readonly remaining = new Map<string, number>();
  private readonly started = Date.now();
  private readonly lines: Every | undefined;
  private readonly bar: cliProgress.SingleBar | undefined;
  private readonly totalBytes: number;
  private readonly totalArrays: number;

  /** `scope`: the objects to be converted, or their bytes and how many objects each array has (progressScope). */
  constructor(
    scope: readonly PlannedObject[] | ProgressScope,
    private readonly mode: ProgressMode,
    private readonly writeLine: (line: string) => void,
    private readonly label = "converting",
  ) {
    const { bytes, objectsPerArray } = Array.isArray(scope) ? progressScope(scope as readonly PlannedObject[]) : (scope as ProgressScope);
    this.totalBytes = bytes;
    for (const [array, n] of objectsPerArray) this.remaining.set(array, n);
    this.totalArrays = this.remaining.size;
    this.lines = schedule(mode, this.started, true);
    if (mode === "bar") {
      this.bar = new cliProgress.SingleBar(
        {
          format: "{bar} {percentage}% | {done}/{totalHuman} | {arrays}/{totalArrays} arrays | {rate}/s | ETA {etaText}",
          hideCursor: true,
          clearOnComplete: true,
          etaBuffer: 50,
        },
        cliProgress.Presets.shades_classic,
      );
      this.bar.start(Math.max(this.totalBytes, 1), 0, this.payload());
    }
  }

  private payload() {
    const seconds = (Date.now() - this.started) / 1000;
    return {
      done: formatBytes(this.bytes),
      totalHuman: formatBytes(this.totalBytes),
      arrays: this.arraysDone,
      totalArrays: this.totalArrays,
      rate: formatBytes(Math.round(seconds > 0 ? this.bytes / seconds : 0)),
      etaText: etaText(eta(this.bytes, this.totalBytes, Date.now() - this.started)),
    };
  }

  object(target: string, bytes: number): void {
    this.bytes += bytes;
    const array = arrayOf(target);
    const left = (this.remaining.get(array) ?? 1) - 1;
    this.remaining.set(array, left);
    if (left === 0) this.arraysDone++;
    if (this.bar) this.bar.update(this.bytes, this.payload());
    else if (this.lines?.due()) this.writeLine(this.mode === "json" ? JSON.stringify(this.snapshot()) : this.line());
  }

  /** The log line: what is done of what, the rate, and the ETA once there is one. */
  line(): string {
    const s = this.snapshot();
    const share = s.totalBytes > 0 ? Math.floor((100 * s.bytes) / s.totalBytes) : 100;
    const seconds = (Date.now() - this.started) / 1000;
    const rate = formatBytes(Math.round(seconds > 0 ? s.bytes / seconds : 0));
    return (
      `${this.label}: ${formatBytes(s.bytes)} of ${formatBytes(s.totalBytes)} (${share}%), ${s.arrays} of ${s.totalArrays} arrays, ` +
      `${rate}/s${s.etaSeconds === null ? "" : `, ETA ${etaText(s.etaSeconds)}`}`
    );
  }

  snapshot() {
    const seconds = (Date.now() - this.started) / 1000;
    const mbps = seconds > 0 ? this.bytes / 1e6 / seconds : 0;
    return {
      event: "progress",
      bytes: this.bytes,
      totalBytes: this.totalBytes,
      arrays: this.arraysDone,
      totalArrays: this.totalArrays,
      mbPerSecond: Number(mbps.toFixed(1)),
      etaSeconds: eta(this.bytes, this.totalBytes, Date.now() - this.started),
    };
  }

  stop(): void {
    this.bar?.stop();
  }
}

/**
 * Progress through a count of items (arrays verified, arrays hashed), like ConvertProgress: a bar; JSON lines
 * every few seconds (none for a run shorter than that); or a line such as "verifying arrays: 120 of 300 (40%),
 * ETA 1m02s" every LINE_EVERY_MS. The total comes with each update, since some callers learn it only once the
 * work has started.
 */
export class CountProgress {
  private done = 0;
  private total = 0;
  private readonly started = Date.now();
  private readonly lines: Every | undefined;
  private bar: cliProgress.SingleBar | undefined;

  constructor(
    private readonly label: string,
    private readonly mode: ProgressMode,
    private readonly writeLine: (line: string) => void,
  ) {
    this.lines = schedule(mode, this.started, false);
  }

  update(done: number, total: number): void {
    this.done = done;
    this.total = total;
    if (this.mode === "bar") {
      if (this.bar === undefined) {
        this.bar = new cliProgress.SingleBar(
          { format: `${this.label} {bar} {value}/{total} | ETA {eta_formatted}`, hideCursor: true, clearOnComplete: true },
          cliProgress.Presets.shades_classic,
        );
        this.bar.start(total, done);
      } else {
        this.bar.setTotal(total);
        this.bar.update(done);
      }
      return;
    }
    if (this.lines?.due()) this.writeLine(this.mode === "json" ? JSON.stringify(this.snapshot()) : this.line());
  }

  /** The log line: how many of how many, and the ETA once there is one. */
  line(): string {
    const s = this.snapshot();
    const share = s.total > 0 ? Math.floor((100 * s.done) / s.total) : 100;
    return `${this.label}: ${s.done} of ${s.total} (${share}%)${s.etaSeconds === null ? "" : `, ETA ${etaText(s.etaSeconds)}`}`;
  }

  snapshot() {
    return {
      event: "progress",
      what: this.label,
      done: this.done,
      total: this.total,
      etaSeconds: eta(this.done, this.total, Date.now() - this.started),
    };
  }

  stop(): void {
    this.bar?.stop();
  }
}

function etaText(seconds: number | null): string {
  if (seconds === null) return "…";
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m${String(seconds % 60).padStart(2, "0")}s`;
  return `${Math.floor(seconds / 3600)}h${String(Math.floor((seconds % 3600) / 60)).padStart(2, "0")}m`;
}

/** `gda/<path>/<chunk>` -> `gda/<path>`: the array an object belongs to. */
function arrayOf(target: string): string {
  return target.slice(0, target.lastIndexOf("/"));
}
