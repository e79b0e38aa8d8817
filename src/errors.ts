/**
 * Every failure the tool reports on purpose is an Orbax2RegError: it names the file (store URL + key), and
 * where it helps the byte offset or the key inside a database, so one line tells the user what is wrong where.
 */
export interface ErrorLocation {
  /** The file or object, as a URL or path the user recognises. */
  readonly path?: string;
  /** Byte offset inside that file. */
  readonly offset?: number;
  /** A key inside a database or a field inside a JSON document. */
  readonly key?: string;
}

export abstract class Orbax2RegError extends Error {
  abstract readonly code: string;
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

function formatMessage(detail: string, where: ErrorLocation): string {
  const parts: string[] = [];
  if (where.path !== undefined) parts.push(where.path);
  if (where.offset !== undefined) parts.push(`offset ${where.offset}`);
  if (where.key !== undefined) parts.push(`key ${JSON.stringify(where.key)}`);
  return parts.length > 0 ? `${parts.join(", ")}: ${detail}` : detail;
}

/** Bytes that do not decode as the format they claim to be (bad magic, truncated, out-of-range varint...). */
export class FormatError extends Orbax2RegError {
  readonly code = "FORMAT";
}

/** A checksum did not match the bytes it covers. */
export class ChecksumError extends Orbax2RegError {
  readonly code = "CHECKSUM";
}

/** A well-formed input that uses something this tool does not implement (a codec, a dtype, a version). */
export class UnsupportedError extends Orbax2RegError {
  readonly code = "UNSUPPORTED";
}

/** A file, object or key that must exist does not. */
export class NotFoundError extends Orbax2RegError {
  readonly code = "NOT_FOUND";
}

/** A JSON metadata document that parses but does not have the fields and types the format requires. */
export class MetadataError extends Orbax2RegError {
  readonly code = "METADATA";
}

/** A step that was never committed by Orbax and so may be incomplete. */
export class UncommittedError extends Orbax2RegError {
  readonly code = "UNCOMMITTED";
}

/** A request the tool refuses for safety (a key escaping the destination, a bad argument). */
export class UsageError extends Orbax2RegError {
  readonly code = "USAGE";
}

/** The pipeline run this job belongs to was cancelled (`orbax2reg cloud cancel`): it must not go on. */
export class CancelledError extends Orbax2RegError {
  readonly code = "CANCELLED";
}

/** A resource limit from the format's own configuration would be exceeded (e.g. max_decoded_node_bytes). */
export class LimitError extends Orbax2RegError {
  readonly code = "LIMIT";
}

/**
 * A storage request that failed for good: a transient fault that outlasted the retry deadline, or an answer
 * that no retry can change (403, a refused upload). Not an Orbax2RegError: the input may be fine, so the CLI
 * exits 1 and the pipeline treats it as retryable. Its stack is the message alone: one line says what failed
 * where, and the call chain of an I/O fault helps nobody.
 */
export class StorageIoError extends Error {
  readonly code = "IO";
  readonly path: string | undefined;

  constructor(detail: string, where: { path?: string } = {}, options?: ErrorOptions) {
    super(where.path === undefined ? detail : `${where.path}: ${detail}`, options);
    this.name = "StorageIoError";
    this.path = where.path;
    this.stack = `${this.name}: ${this.message}`;
  }
}

/**
 * The destination cannot be written for a reason the user fixes there: a file where a directory must be,
 * a directory where a file must be, no permission, a read-only or full disk, a bucket that does not exist.
 * The CLI prints it as one line and exits 3. Not an Orbax2RegError: the input is fine, so the pipeline
 * treats it as it did before (retryable a bounded number of times: a full disk may be freed meanwhile).
 */
export class DestinationError extends Error {
  readonly code = "DESTINATION";
  readonly path: string | undefined;

  constructor(detail: string, where: { path?: string } = {}, options?: ErrorOptions) {
    super(where.path === undefined ? detail : `${where.path}: ${detail}`, options);
    this.name = "DestinationError";
    this.path = where.path;
  }
}

/**
 * Another conversion holds the destination step: its plan is the one on record, or it committed an index
 * this plan did not write. Only `--force` takes the step over.
 */
export class ConflictError extends Orbax2RegError {
  readonly code = "CONFLICT";
}
