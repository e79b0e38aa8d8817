/**
 * Every failure the tool reports on purpose is an Orbax2RegError: it names the file (store URL + key), and
 * where it helps the byte offset or the key inside a database, so one line tells the user what is wrong where.
 *
 * What a failure means follows from its class alone, as three fields each class sets (the table is pinned by
 * test/errors.test.ts): `kind`, a stable tag for logs and reports; `exitCode`, what the CLI exits with; and
 * `retryable`, whether a later attempt can succeed where this one failed (a job's failure is transient, a
 * redelivered event may start). classify() reads them, and gives every other thrown value its meaning too:
 * the CLI, the jobs and the trigger function decide through it and nowhere else.
 */
export interface ErrorLocation {
  /** The file or object, as a URL or path the user recognises. */
  readonly path?: string;
  /** Byte offset inside that file. */
  readonly offset?: number;
  /** A key inside a database or a field inside a JSON document. */
  readonly key?: string;
}

/**
 * Exit codes: 0 success, 1 a failure that is not the input's (an I/O fault that outlasted its retries, a bug),
 * 2 bad input, usage or a refusal (e.g. another conversion holds the destination, a source bucket that does not
 * exist), 3 the destination cannot be written (not a directory, a directory where a file goes, no permission,
 * read-only, full, no such bucket), 4 a check that ran to its end found a difference (`verify`, `cloud check`: no
 * error class, the command's answer), 143 (128 + SIGTERM's 15) a job task that was told to stop.
 */
export const EXIT_FAILURE = 1;
export const EXIT_BAD_INPUT = 2;
export const EXIT_DESTINATION = 3;
export const EXIT_CHECK_FAILED = 4;
export const EXIT_STOPPED = 143;

export abstract class Orbax2RegError extends Error {
  /** What kind of failure, as a stable tag (FORMAT, IO, ...). */
  abstract readonly kind: string;
  /** What the CLI exits with (src/cli/main.ts). */
  abstract readonly exitCode: number;
  /**
   * Whether trying again can help: false for the input's own faults (a job exits 2 and is not retried),
   * true for anything the input is not to blame for (a job exits 1 and the workflow retries it, boundedly).
   */
  abstract readonly retryable: boolean;
  readonly path: string | undefined;
  readonly offset: number | undefined;
  readonly key: string | undefined;
  readonly detail: string;

  constructor(detail: string, where: ErrorLocation = {}, options?: ErrorOptions) {
    super(formatMessage(detail, where), options);
    this.detail = detail;
    this.path = where.path;
    this.offset = where.offset;
    this.key = where.key;
    this.name = new.target.name;
  }
}

/** Made printable (see printable): the path and the detail may hold what a file put there. */
function formatMessage(detail: string, where: ErrorLocation): string {
  const parts: string[] = [];
  if (where.path !== undefined) parts.push(where.path);
  if (where.offset !== undefined) parts.push(`offset ${where.offset}`);
  if (where.key !== undefined) parts.push(`key ${JSON.stringify(where.key)}`);
  return printable(parts.length > 0 ? `${parts.join(", ")}: ${detail}` : detail);
}

/**
 * Control characters (C0, DEL, C1), Unicode's line and paragraph separators, bidirectional overrides and lone
 * surrogates: what a line of text from a file must not carry to a terminal or a log unescaped.
 */
const UNPRINTABLE =
  // biome-ignore lint/suspicious/noControlCharactersInRegex: finding control characters is what it is for.
  /[\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;
const NAMED: Readonly<Record<string, string>> = { "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f" };

/**
 * Text that came from a file, a key or an object name, made safe to print on one line: every character of
 * UNPRINTABLE escaped as JSON writes it (`\n`, `\r`, `\u0000`, `\u001b`), so that a crafted checkpoint cannot
 * split a message into lines, move a terminal's cursor or colour it, or forge a line of a CI log. Other text,
 * non-ASCII included, is unchanged. Every Orbax2RegError's message goes through it, and so do the CLI's tables
 * and verify's lines.
 */
export function printable(text: string): string {
  return text.replace(UNPRINTABLE, (c) => NAMED[c] ?? `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

/** An Orbax2RegError that no retry can help: the input, the request or the configuration is at fault. */
export function isPermanent(e: unknown): e is Orbax2RegError {
  return e instanceof Orbax2RegError && !e.retryable;
}

// The input's faults: exit 2, never retried.

/** Bytes that do not decode as the format they claim to be (bad magic, truncated, out-of-range varint...). */
export class FormatError extends Orbax2RegError {
  readonly kind = "FORMAT";
  readonly exitCode = EXIT_BAD_INPUT;
  readonly retryable = false;
}

/** A checksum did not match the bytes it covers. */
export class ChecksumError extends Orbax2RegError {
  readonly kind = "CHECKSUM";
  readonly exitCode = EXIT_BAD_INPUT;
  readonly retryable = false;
}

/** A well-formed input that uses something this tool does not implement (a codec, a dtype, a version). */
export class UnsupportedError extends Orbax2RegError {
  readonly kind = "UNSUPPORTED";
  readonly exitCode = EXIT_BAD_INPUT;
  readonly retryable = false;
}

/** A file, object or key that must exist does not. */
export class NotFoundError extends Orbax2RegError {
  readonly kind = "NOT_FOUND";
  readonly exitCode = EXIT_BAD_INPUT;
  readonly retryable = false;
}

/** A JSON metadata document that parses but does not have the fields and types the format requires. */
export class MetadataError extends Orbax2RegError {
  readonly kind = "METADATA";
  readonly exitCode = EXIT_BAD_INPUT;
  readonly retryable = false;
}

/** A step that was never committed by Orbax and so may be incomplete. */
export class UncommittedError extends Orbax2RegError {
  readonly kind = "UNCOMMITTED";
  readonly exitCode = EXIT_BAD_INPUT;
  readonly retryable = false;
}

/**
 * A step whose processes did not all save the same input-iterator files (one process's `tfds/tf_<i>` or
 * `python/python_<i>` is missing): AXLearn's restore on that many processes fails on the process that lacks them
 * while the others wait for it, so the conversion is refused.
 */
export class IteratorsError extends Orbax2RegError {
  readonly kind = "ITERATORS";
  readonly exitCode = EXIT_BAD_INPUT;
  readonly retryable = false;
}

/** A request the tool refuses for safety (a key escaping the destination, a bad argument). */
export class UsageError extends Orbax2RegError {
  readonly kind = "USAGE";
  readonly exitCode = EXIT_BAD_INPUT;
  readonly retryable = false;
}

/** The pipeline run this job belongs to was cancelled (`orbax2reg cloud cancel`): it must not go on. */
export class CancelledError extends Orbax2RegError {
  readonly kind = "CANCELLED";
  readonly exitCode = EXIT_BAD_INPUT;
  readonly retryable = false;
}

/** A resource limit from the format's own configuration would be exceeded (e.g. max_decoded_node_bytes). */
export class LimitError extends Orbax2RegError {
  readonly kind = "LIMIT";
  readonly exitCode = EXIT_BAD_INPUT;
  readonly retryable = false;
}

/**
 * Another conversion holds the destination step: its plan is the one on record, or it committed an index
 * this plan did not write. Only `--force` takes the step over.
 */
export class ConflictError extends Orbax2RegError {
  readonly kind = "CONFLICT";
  readonly exitCode = EXIT_BAD_INPUT;
  readonly retryable = false;
}

/**
 * A deployment setting read from an environment variable (src/cloud/env.ts) is missing or malformed; it names
 * the variable and what it holds. Redelivering an event or retrying a job cannot fix it, only a redeploy can:
 * a job exits 2, and the trigger function acknowledges every event until redeployed (functions/index.ts).
 */
export class ConfigError extends Orbax2RegError {
  readonly kind = "CONFIG";
  readonly exitCode = EXIT_BAD_INPUT;
  readonly retryable = false;
  constructor(
    readonly variable: string,
    readonly value: string | undefined,
    readonly why: string,
  ) {
    super(`environment variable ${variable}${value === undefined ? " is not set" : `=${JSON.stringify(value)}`}: ${why}`);
  }
}

/**
 * No Google credentials to send to Cloud Storage: Application Default Credentials found nothing (no
 * GOOGLE_APPLICATION_CREDENTIALS, no `gcloud auth application-default login` file, no metadata server). Trying
 * again cannot find them, so it is said at once instead of being retried until the storage deadline.
 */
export class CredentialsError extends Orbax2RegError {
  readonly kind = "CREDENTIALS";
  readonly exitCode = EXIT_BAD_INPUT;
  readonly retryable = false;
  constructor(detail: string, where: { path?: string } = {}) {
    super(detail, { path: where.path });
    this.stack = `${this.name}: ${this.message}`;
  }
}

// Not the input's faults: the input may be fine, so a job exits 1 and the workflow retries it (boundedly).

/**
 * A storage request that failed for good: a transient fault that outlasted the retry deadline, or an answer
 * that no retry can change (403, a refused upload). The CLI exits 1; a re-run resumes. Its stack is the
 * message alone: one line says what failed where, and the call chain of an I/O fault helps nobody.
 */
export class StorageIoError extends Orbax2RegError {
  readonly kind = "IO";
  readonly exitCode = EXIT_FAILURE;
  readonly retryable = true;

  constructor(detail: string, where: { path?: string } = {}, options?: ErrorOptions) {
    super(detail, { path: where.path }, options);
    this.stack = `${this.name}: ${this.message}`;
  }
}

/**
 * One attempt of a storage request failed in a way the next may not (src/store/retry.ts retries it until its
 * deadline, then gives up with a StorageIoError). `retryKind` names the failure in the retry counters
 * (http-503, reset, timeout, checksum...).
 */
export class TransientError extends Orbax2RegError {
  readonly kind = "TRANSIENT";
  readonly exitCode = EXIT_FAILURE;
  readonly retryable = true;
  constructor(
    message: string,
    readonly retryKind: string,
    /** What the server asked for (Retry-After), if anything. */
    readonly retryAfterMs?: number,
  ) {
    super(message);
  }
}

/**
 * The destination cannot be written for a reason the user fixes there: a file where a directory must be,
 * a directory where a file must be, no permission, a read-only or full disk, a bucket that does not exist.
 * The CLI prints it as one line and exits 3. The input is fine, so a job treats it as transient (retried a
 * bounded number of times: a full disk may be freed meanwhile).
 */
export class DestinationError extends Orbax2RegError {
  readonly kind = "DESTINATION";
  readonly exitCode = EXIT_DESTINATION;
  readonly retryable = true;

  constructor(detail: string, where: { path?: string } = {}, options?: ErrorOptions) {
    super(detail, { path: where.path }, options);
  }
}

// The pipeline's own (src/cloud): the trigger function's and the jobs'.

/**
 * A job task was told to stop: SIGTERM (its job execution was cancelled, or it ran past its task timeout).
 * It exits 143 with no failure report: not the input's fault, so whoever stopped it decides what follows
 * (a cancelled run goes no further; a task past its timeout fails like any transient failure).
 */
export class StoppedError extends Orbax2RegError {
  readonly kind = "STOPPED";
  readonly exitCode = EXIT_STOPPED;
  readonly retryable = true;
}

/** A fresh claim held by another caller that has not recorded an execution yet: retry later. */
export class ClaimBusyError extends Orbax2RegError {
  readonly kind = "CLAIM_BUSY";
  readonly exitCode = EXIT_FAILURE;
  readonly retryable = true;
}

/** The caller's deadline passed before it could start an execution: retry later. */
export class DeadlineError extends Orbax2RegError {
  readonly kind = "DEADLINE";
  readonly exitCode = EXIT_FAILURE;
  readonly retryable = true;
}

/**
 * A call to the Cloud Run Admin API that failed (src/cloud/api/run-executions.ts, after its own retries); `code`
 * is the gRPC status code (the REST fallback maps HTTP onto it). Like a StorageIoError: exit 1, and the
 * command can be run again.
 */
export class RunApiError extends Orbax2RegError {
  readonly kind = "RUN_API";
  readonly exitCode = EXIT_FAILURE;
  readonly retryable = true;
  constructor(
    readonly method: "get" | "cancel",
    readonly execution: string,
    readonly code: number | undefined,
    cause: unknown,
  ) {
    super(`Cloud Run executions.${method} ${execution}: ${cause instanceof Error ? cause.message : String(cause)}`, {}, { cause });
  }
}

/**
 * A call to the Cloud Quotas API that failed (src/cloud/api/quotas.ts, after its own retries): `status` is the
 * HTTP status, undefined when no answer came. Exit 1, like the other API failures; `cloud check` reports a 401 or
 * 403 as a missing permission.
 */
export class QuotaApiError extends Orbax2RegError {
  readonly kind = "QUOTA_API";
  readonly exitCode = EXIT_FAILURE;
  readonly retryable = true;
  constructor(
    message: string,
    readonly status: number | undefined,
  ) {
    super(message);
  }
}

/** A Google REST API that `cloud check` reads (Eventarc, Pub/Sub) refused or failed; `status` is the HTTP status, if any. */
export class CloudApiError extends Orbax2RegError {
  readonly kind = "CLOUD_API";
  readonly exitCode = EXIT_FAILURE;
  readonly retryable = true;
  constructor(
    message: string,
    readonly status: number | undefined,
  ) {
    super(message);
  }
}

/** Why an OS error code means the destination cannot be written, in words (none: not a destination problem). */
const IO_CAUSES: Readonly<Record<string, string>> = {
  ENOTDIR: "a parent of this path is a file, not a directory",
  EEXIST: "a file is in the way of a directory",
  EISDIR: "is a directory, not a file",
  ENOTEMPTY: "is a directory, not a file",
  EACCES: "permission denied",
  EPERM: "operation not permitted",
  EROFS: "read-only file system",
  ENOSPC: "no space left on device",
  EDQUOT: "disk quota exceeded",
  ELOOP: "a symbolic link loop (too many levels of symbolic links)",
};

/** The cause of an OS error that the user can fix at the destination, or undefined for anything else. */
export function ioCause(e: unknown): string | undefined {
  const code = (e as NodeJS.ErrnoException | undefined)?.code;
  return typeof code === "string" && Object.hasOwn(IO_CAUSES, code) ? IO_CAUSES[code] : undefined;
}

/** What a thrown value means: the kind, the CLI's exit code, whether a retry can help, and the one line to say. */
export interface Classified {
  readonly kind: string;
  readonly exitCode: number;
  readonly retryable: boolean;
  /** The one line to print or log (without the CLI's "orbax2reg: "). */
  readonly line: string;
}

/** The kind of a value no class gives a meaning to: a bug, or a fault nobody named. */
export const UNEXPECTED = "UNEXPECTED";

/**
 * The meaning of anything thrown. An Orbax2RegError says it itself. An OS error that names a path and a
 * cause the user fixes there (ENOTDIR, EACCES, ENOSPC... that no store translated) is a destination problem,
 * as a DestinationError would be. Anything else (a bug, a connection reset, too many open files, an API
 * client's error) is unexpected: exit 1, and retryable, since the input is not known to be at fault.
 */
export function classify(e: unknown): Classified {
  if (e instanceof Orbax2RegError) return { kind: e.kind, exitCode: e.exitCode, retryable: e.retryable, line: e.message };
  const cause = ioCause(e);
  const path = (e as NodeJS.ErrnoException | undefined)?.path;
  if (cause !== undefined && typeof path === "string") {
    return { kind: "DESTINATION", exitCode: EXIT_DESTINATION, retryable: true, line: `${path}: ${cause}` };
  }
  return {
    kind: UNEXPECTED,
    exitCode: EXIT_FAILURE,
    retryable: true,
    line: `unexpected error: ${e instanceof Error ? e.message : String(e)}`,
  };
}
