// What an error means follows from its class (src/errors.ts): its kind, the CLI's exit code, and whether a
// retry can help (a job's permanent or transient failure, a redelivered event). The table below is the
// contract; changing a row is changing what the CLI exits with or what the pipeline retries.
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { RetentionError } from "../src/cloud/job/retention.js";
import * as errors from "../src/errors.js";
import {
  CancelledError,
  ChecksumError,
  ClaimBusyError,
  CloudApiError,
  ConfigError,
  ConflictError,
  CredentialsError,
  classify,
  DeadlineError,
  DestinationError,
  FormatError,
  IteratorsError,
  LimitError,
  MetadataError,
  NotFoundError,
  Orbax2RegError,
  QuotaApiError,
  RunApiError,
  StoppedError,
  StorageIoError,
  TransientError,
  UNEXPECTED,
  UncommittedError,
  UnsupportedError,
  UsageError,
} from "../src/errors.js";
import { removeScratch, scratch } from "./helpers/convert.js";

afterAll(removeScratch);

/** Every error class: an instance, its kind, the CLI's exit code, and whether a retry can help. */
const TABLE: readonly (readonly [Orbax2RegError, string, number, boolean])[] = [
  // The input's, the request's or the configuration's fault: exit 2, a job fails permanently.
  [new FormatError("bad magic"), "FORMAT", 2, false],
  [new ChecksumError("crc mismatch"), "CHECKSUM", 2, false],
  [new UnsupportedError("codec"), "UNSUPPORTED", 2, false],
  [new NotFoundError("no such file"), "NOT_FOUND", 2, false],
  [new MetadataError("field"), "METADATA", 2, false],
  [new UncommittedError("uncommitted"), "UNCOMMITTED", 2, false],
  [new IteratorsError("process 1 lacks python/python_1/input_iter"), "ITERATORS", 2, false],
  [new UsageError("bad flag"), "USAGE", 2, false],
  [new CancelledError("cancelled"), "CANCELLED", 2, false],
  [new LimitError("too large"), "LIMIT", 2, false],
  [new ConflictError("held"), "CONFLICT", 2, false],
  [new ConfigError("N", "x", "must be a number"), "CONFIG", 2, false],
  [new CredentialsError("no Google credentials found"), "CREDENTIALS", 2, false],
  // Not the input's: a job fails transiently (the workflow retries, boundedly).
  [new StorageIoError("HTTP 403"), "IO", 1, true],
  [new TransientError("HTTP 503", "http-503"), "TRANSIENT", 1, true],
  [new DestinationError("no space left on device"), "DESTINATION", 3, true],
  [new StoppedError("SIGTERM"), "STOPPED", 143, true],
  [new ClaimBusyError("claim held"), "CLAIM_BUSY", 1, true],
  [new DeadlineError("deadline passed"), "DEADLINE", 1, true],
  [new RunApiError("get", "projects/p/locations/r/jobs/j/executions/e", 7, new Error("denied")), "RUN_API", 1, true],
  [new QuotaApiError("cloudquotas: HTTP 403", 403), "QUOTA_API", 1, true],
  [new CloudApiError("eventarc: HTTP 403", 403), "CLOUD_API", 1, true],
  [new RetentionError([{ step: 100, error: "HTTP 403" }], []), "RETENTION", 1, true],
];

/** Error classes that never leave their module (control flow), so they need no meaning outside it. */
const INTERNAL = new Set(["StageFailed"]);

describe("the error table", () => {
  test.each(TABLE.map((row) => [row[0].name, ...row] as const))("%s: kind, exit code, retryable", (_, e, kind, exitCode, retryable) => {
    expect({ kind: e.kind, exitCode: e.exitCode, retryable: e.retryable }).toEqual({ kind, exitCode, retryable });
    expect(classify(e)).toEqual({ kind, exitCode, retryable, line: e.message });
  });

  test("every error class in src/errors.ts is in the table", () => {
    const classes = Object.entries(errors)
      .filter(([, v]) => typeof v === "function" && v.prototype instanceof Orbax2RegError)
      .map(([name]) => name);
    const listed = TABLE.map(([e]) => e.name);
    expect(classes.filter((name) => !listed.includes(name))).toEqual([]);
  });

  test("every error class declared anywhere in the product is an Orbax2RegError in the table", () => {
    const declared: string[] = [];
    for (const dir of ["src", "functions", "jobs"]) {
      for (const f of readdirSync(dir, { recursive: true, encoding: "utf8" }).filter((f) => f.endsWith(".ts"))) {
        for (const m of readFileSync(join(dir, f), "utf8").matchAll(/\bclass (\w+) extends (\w+)/g)) {
          if (/Error$/.test(m[2] as string)) declared.push(m[1] as string);
        }
      }
    }
    const listed = new Set(TABLE.map(([e]) => e.name));
    expect(declared.filter((name) => !listed.has(name) && !INTERNAL.has(name) && name !== "Orbax2RegError")).toEqual([]);
  });

  test("the message names the path, the offset and the key", () => {
    const e = new FormatError("bad varint", { path: "gs://b/x/manifest.ocdbt", offset: 12, key: "a/b" });
    expect(classify(e).line).toBe('gs://b/x/manifest.ocdbt, offset 12, key "a/b": bad varint');
  });

  test("a message is printable: what a file put into it (CR/LF, NUL, BEL, ESC, DEL, C1, bidi overrides) is escaped", () => {
    const e = new MetadataError('not valid JSON ("a\r\nb\u0000c\u0007\u001b[31m\u007f\u0085\u202e")', { path: "/s/_METADATA" });
    expect(e.message).toBe('/s/_METADATA: not valid JSON ("a\\r\\nb\\u0000c\\u0007\\u001b[31m\\u007f\\u0085\\u202e")');
  });

  test("printable leaves other text as it is, non-ASCII and emoji included, and escapes a lone surrogate", () => {
    expect(errors.printable("größe/日本/🙂 a\\b")).toBe("größe/日本/🙂 a\\b");
    expect(errors.printable("x\ud800y")).toBe("x\\ud800y");
  });

  test("a storage error's stack is its one line (the call chain of an I/O fault helps nobody)", () => {
    expect(new StorageIoError("HTTP 403", { path: "gs://b/o" }).stack).toBe("StorageIoError: gs://b/o: HTTP 403");
  });
});

/** A Node system error as libuv reports it. */
const systemError = (code: string, message: string, extra: { path?: string; syscall?: string } = {}) =>
  Object.assign(new Error(message), { code, errno: -1, syscall: extra.syscall ?? "read", ...extra });

describe("classify() on errors no class gives a meaning to", () => {
  const unexpected = (line: string) => ({ kind: UNEXPECTED, exitCode: 1, retryable: true, line });

  test("a plain Error is unexpected: exit 1, retryable, its message", () => {
    expect(classify(new Error("boom"))).toEqual(unexpected("unexpected error: boom"));
  });

  test("a gRPC-like error with a numeric code is unexpected", () => {
    const grpc = Object.assign(new Error("14 UNAVAILABLE: connection refused"), { code: 14, details: "connection refused" });
    expect(classify(grpc)).toEqual(unexpected("unexpected error: 14 UNAVAILABLE: connection refused"));
  });

  test("a connection reset (ECONNRESET) is unexpected, and retryable", () => {
    expect(classify(systemError("ECONNRESET", "read ECONNRESET"))).toEqual(unexpected("unexpected error: read ECONNRESET"));
  });

  test("too many open files (EMFILE) is unexpected even with a path: nothing to fix there", () => {
    const e = systemError("EMFILE", "EMFILE: too many open files, open '/d/x'", { path: "/d/x", syscall: "open" });
    expect(classify(e)).toEqual(unexpected("unexpected error: EMFILE: too many open files, open '/d/x'"));
  });

  test("a full disk (ENOSPC) at a path is a destination problem: exit 3, one line naming the path", () => {
    const e = systemError("ENOSPC", "ENOSPC: no space left on device, write", { path: "/d/x", syscall: "write" });
    expect(classify(e)).toEqual({ kind: "DESTINATION", exitCode: 3, retryable: true, line: "/d/x: no space left on device" });
  });

  test("a real OS error from node:fs (ENOTDIR) is a destination problem naming its path", async () => {
    const file = join(scratch("classify"), "file");
    writeFileSync(file, "");
    const e = await readFile(join(file, "x")).catch((e: unknown) => e);
    expect(classify(e)).toEqual({
      kind: "DESTINATION",
      exitCode: 3,
      retryable: true,
      line: `${file}/x: a parent of this path is a file, not a directory`,
    });
  });

  test("ENOSPC without a path is unexpected: there is nowhere to point at", () => {
    expect(classify(systemError("ENOSPC", "ENOSPC: no space left on device"))).toEqual(
      unexpected("unexpected error: ENOSPC: no space left on device"),
    );
  });

  test("a code that merely names an object property is not a cause", () => {
    expect(classify(systemError("constructor", "odd", { path: "/d/x" })).kind).toBe(UNEXPECTED);
  });

  test("a thrown value that is not an Error is unexpected, in words", () => {
    expect(classify("a string")).toEqual(unexpected("unexpected error: a string"));
    expect(classify(undefined)).toEqual(unexpected("unexpected error: undefined"));
    expect(classify({ code: 5 })).toEqual(unexpected("unexpected error: [object Object]"));
  });
});
