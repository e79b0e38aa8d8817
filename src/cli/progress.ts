import cliProgress from "cli-progress";
import { dataLength, type PlannedObject } from "../convert/plan-format.js";
import { formatBytes } from "./format.js";

/** How often a progress JSON line is printed where there is no terminal to draw a bar on. */
const LINE_EVERY_MS = 3000;

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

/** True at most once per LINE_EVERY_MS, counting from `last` (0: the first call is due at once). */
class Every {
  constructor(private last: number) {}

  due(now = Date.now()): boolean {
    if (now - this.last < LINE_EVERY_MS) return false;
    this.last = now;
    return true;
  }
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
 * Conversion progress: a bar on a terminal (bytes, arrays, MB/s, ETA); elsewhere a JSON line on stderr
 * every few seconds, which logs and scripts can parse.
 */
export class ConvertProgress {
  private bytes = 0;
  private arraysDone = 0;
  private readonly remaining = new Map<string, number>();
  private readonly started = Date.now();
  private readonly lines = new Every(0); // the first line at once: a conversion may run for minutes
  private readonly bar: cliProgress.SingleBar | undefined;
  private readonly totalBytes: number;
  private readonly totalArrays: number;

  /** `scope`: the objects to be converted, or their bytes and how many objects each array has (progressScope). */
  constructor(
    scope: readonly PlannedObject[] | ProgressScope,
    tty: boolean,
    private readonly writeLine: (line: string) => void,
  ) {
    const { bytes, objectsPerArray } = Array.isArray(scope) ? progressScope(scope as readonly PlannedObject[]) : (scope as ProgressScope);
    this.totalBytes = bytes;
    for (const [array, n] of objectsPerArray) this.remaining.set(array, n);
    this.totalArrays = this.remaining.size;
    if (tty) {
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
      rate: formatBytes(seconds > 0 ? this.bytes / seconds : 0),
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
    else if (this.lines.due()) this.writeLine(JSON.stringify(this.snapshot()));
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
 * Progress through a count of items (arrays verified, arrays hashed), like ConvertProgress: a bar on a
 * terminal; elsewhere a JSON line on stderr every few seconds (none for a run shorter than that). The total
 * comes with each update, since some callers learn it only once the work has started.
 */
export class CountProgress {
  private done = 0;
  private total = 0;
  private readonly started = Date.now();
  private readonly lines = new Every(this.started); // none for a run shorter than the interval
  private bar: cliProgress.SingleBar | undefined;

  constructor(
    private readonly label: string,
    private readonly tty: boolean,
    private readonly writeLine: (line: string) => void,
  ) {}

  update(done: number, total: number): void {
    this.done = done;
    this.total = total;
    if (this.tty) {
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
    if (this.lines.due()) this.writeLine(JSON.stringify(this.snapshot()));
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
