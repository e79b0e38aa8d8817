import { type JobPhase, type ProgressRecord, progressKey } from "../../convert/work-dir.js";
import { openStore } from "../../store/open.js";
import { joinKey, type Store } from "../../store/store.js";
import { cloudRunTask, type Env } from "../api/env.js";
import type { Logger } from "../api/log.js";
import { cloudRunExecutionName, recordedGroup, recordedStepDir, recordStoreOptions } from "./reports.js";

const encodeJson = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));

/** How often a running task rewrites its progress record. */
const PROGRESS_WRITE_EVERY_MS = 15_000;

export interface JobOptions {
  /** How often a running task rewrites its progress record (default 15 s). */
  readonly progressEveryMs?: number;
  /** Called after each progress record is written (tests watch the records go by). */
  readonly onProgress?: (key: string, record: ProgressRecord) => void;
}

type Mutable<T> = { -readonly [K in keyof T]: T[K] };

function keyOf(phase: JobPhase, group: number | null, task: number): string | undefined {
  try {
    return progressKey(phase, group, task);
  } catch {
    return undefined;
  }
}

/**
 * This task's progress record (ProgressRecord, src/convert/work-dir.ts), kept up to date in the destination step. Best effort: a
 * failed write (retried for RECORD_RETRY_DEADLINE_MS, not the phase's minutes) is logged and never fails
 * the job. Writes are chained, so they land in order and the final one (awaited before the job exits) is
 * the one that stays.
 */
export class Progress {
  private readonly record: Mutable<ProgressRecord>;
  private readonly key: string | undefined;
  private readonly destination: string | undefined;
  private stepDir: string | undefined;
  private store: Promise<Store> | undefined;
  private chain: Promise<void> = Promise.resolve();
  private lastWrite = 0;
  /** Set by finish(): nothing is written after the last record (a phase left running after a stop may still report progress). */
  private finished = false;

  constructor(
    phase: JobPhase,
    env: Env,
    started: number,
    private readonly log: Logger,
    private readonly options: JobOptions,
  ) {
    const group = recordedGroup(phase, env);
    // Lenient: the constructor must not throw (runJob builds the record before it can report a failure).
    const { index: task, count } = cloudRunTask(env, { lenient: true });
    const at = new Date(started).toISOString();
    this.record = {
      phase,
      group,
      task,
      taskCount: count,
      attempt: env.ORBAX2REG_ATTEMPT || null,
      workflowExecution: env.ORBAX2REG_EXECUTION || null,
      execution: cloudRunExecutionName(env),
      state: "running",
      objects: null,
      objectsDone: 0,
      bytes: null,
      bytesDone: 0,
      startedAt: at,
      updatedAt: at,
      error: null,
    };
    // Without a usable group or task index (misconfigured) there is no key; the failure report tells the story.
    this.key = keyOf(phase, group, task);
    this.destination = env.ORBAX2REG_DESTINATION || undefined;
    this.stepDir = recordedStepDir(env);
  }

  /** The destination step, once known (a plan run without ORBAX2REG_STEP learns it from the source). */
  at(stepDir: string): void {
    this.stepDir ??= stepDir;
  }

  /** Updates fields without writing. */
  set(fields: Partial<Pick<ProgressRecord, "objects" | "objectsDone" | "bytes" | "bytesDone">>): void {
    Object.assign(this.record, fields);
  }

  /** Writes now (not awaited). */
  write(): void {
    if (this.finished) return;
    if (this.key === undefined || this.destination === undefined || this.stepDir === undefined) return;
    this.lastWrite = Date.now();
    const snapshot: ProgressRecord = { ...this.record, updatedAt: new Date(this.lastWrite).toISOString() };
    const key = joinKey(this.stepDir, this.key);
    const destination = this.destination;
    this.chain = this.chain.then(async () => {
      try {
        this.store ??= openStore(destination, recordStoreOptions());
        await (await this.store).write(key, encodeJson(snapshot));
        this.options.onProgress?.(key, snapshot);
      } catch (w) {
        this.log.warn("could not write the progress record", { key, error: (w as Error).message });
      }
    });
  }

  /** Counts progress; writes when the last write is older than the interval. */
  advance(objects: number, bytes: number): void {
    this.record.objectsDone += objects;
    this.record.bytesDone += bytes;
    if (Date.now() - this.lastWrite >= (this.options.progressEveryMs ?? PROGRESS_WRITE_EVERY_MS)) this.write();
  }

  /**
   * The last write: succeeded, failed or stopped (with the error's first line). Resolves once it has landed
   * or failed; later writes are dropped.
   */
  async finish(state: "succeeded" | "failed" | "stopped", error: Error | null): Promise<void> {
    if (this.finished) return this.chain;
    this.record.state = state;
    this.record.error = error === null ? null : (error.message.split("\n")[0] ?? "");
    this.write();
    this.finished = true;
    await this.chain;
  }
}
