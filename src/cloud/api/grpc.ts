/**
 * The status codes of Google's API clients (google-gax), and the one retry loop their calls go through.
 *
 * An error from a gax client carries a numeric `code`: the gRPC status code
 * (https://github.com/googleapis/googleapis/blob/master/google/rpc/code.proto), or, over the REST fallback
 * when the error body could not be parsed, the HTTP status that stands for it
 * (https://cloud.google.com/apis/design/errors#handling_errors). The two never overlap (codes are 0-16), so
 * each test below accepts both spellings.
 */
export const Code = {
  OK: 0,
  CANCELLED: 1,
  UNKNOWN: 2,
  INVALID_ARGUMENT: 3,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  ALREADY_EXISTS: 6,
  PERMISSION_DENIED: 7,
  RESOURCE_EXHAUSTED: 8,
  FAILED_PRECONDITION: 9,
  ABORTED: 10,
  OUT_OF_RANGE: 11,
  UNIMPLEMENTED: 12,
  INTERNAL: 13,
  UNAVAILABLE: 14,
  DATA_LOSS: 15,
  UNAUTHENTICATED: 16,
} as const;

/** The error's numeric code (gRPC or HTTP), if it has one. */
export function codeOf(e: unknown): number | undefined {
  const code = (e as { code?: unknown } | null | undefined)?.code;
  return typeof code === "number" ? code : undefined;
}

/** NOT_FOUND (HTTP 404): the resource does not exist. */
export function isNotFound(e: unknown): boolean {
  const code = codeOf(e);
  return code === Code.NOT_FOUND || code === 404;
}

/**
 * A request no retry can fix: it is malformed (INVALID_ARGUMENT), the resource's state forbids it
 * (FAILED_PRECONDITION; both HTTP 400) or the resource does not exist (NOT_FOUND, HTTP 404).
 */
export function isPermanent(e: unknown): boolean {
  const code = codeOf(e);
  return code === Code.INVALID_ARGUMENT || code === Code.NOT_FOUND || code === Code.FAILED_PRECONDITION || code === 400 || code === 404;
}

/**
 * A failure the design guide says to retry with backoff: the call timed out (DEADLINE_EXCEEDED, HTTP 504) or
 * the service is unavailable for now (UNAVAILABLE, HTTP 503).
 */
export function isUnavailable(e: unknown): boolean {
  const code = codeOf(e);
  return code === Code.DEADLINE_EXCEEDED || code === Code.UNAVAILABLE || code === 503 || code === 504;
}

/** How one call is retried: how many tries in all, the pause before try n + 1, and which failures qualify. */
export interface CallRetry {
  readonly tries: number;
  readonly delayMs: (failedTry: number) => number;
  readonly retryable: (e: unknown) => boolean;
}

/**
 * `call`, tried again after a failure `policy` calls retryable, at most `policy.tries` times in all; the
 * last failure is thrown as it is. Only for calls that are safe to repeat (a get, a list page): the
 * clients' own configurations retry none of these methods (they mark them all non-idempotent).
 */
export async function retryCall<T>(call: () => Promise<T>, policy: CallRetry): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await call();
    } catch (e) {
      if (attempt >= policy.tries || !policy.retryable(e)) throw e;
      await new Promise((r) => setTimeout(r, policy.delayMs(attempt)));
    }
  }
}
