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

/** A resource limit from the format's own configuration would be exceeded (e.g. max_decoded_node_bytes). */
export class LimitError extends Orbax2RegError {
  readonly code = "LIMIT";
}
