/**
 * A timestamp as Google's clients give it, as RFC 3339, or null when unset. The gax clients hand out protobuf
 * Timestamps (`{seconds, nanos}`, seconds a Long, number or string); their REST fallback and the emulators, strings.
 */
export function rfc3339(t: { seconds?: unknown; nanos?: unknown } | string | null | undefined): string | null {
  if (typeof t === "string") return t || null;
  if (!t || t.seconds === undefined || t.seconds === null) return null;
  const ms = Number(String(t.seconds)) * 1000 + Math.floor(Number(t.nanos ?? 0) / 1e6);
  return Number.isFinite(ms) ? new Date(ms).toISOString() : null;
}
