// A stream that can be read again from its start. A write that fails halfway through a streamed upload can
// only be retried if its bytes can be had again; a store's readStream can give them (it reopens the range),
// an arbitrary generator cannot. GcsStore.write retries streamed uploads only when the data is replayable.

// A byte stream of known length that can also be read again from any offset (a store's ranged download) is
// `Ranged`: then a resumable upload streams each chunk straight from it, and after a failure re-reads from
// where the server says it has the bytes, with nothing held in memory.

const REPLAY = Symbol.for("orbax2reg.store.replay");
const RANGED = Symbol.for("orbax2reg.store.ranged");

export interface Replayable<T> extends AsyncIterable<T> {
  [REPLAY](): AsyncIterable<T>;
}

/** Bytes of a known length, readable from any offset. */
export interface Ranged {
  readonly length: number;
  /** The bytes from `skip` to the end. */
  from(skip: number): AsyncIterable<Uint8Array>;
}

/** An iterable whose every iteration calls `open` afresh; with `ranged`, also readable from any offset. */
export function replayable<T>(open: () => AsyncIterable<T>, ranged?: Ranged): Replayable<T> {
  return {
    [Symbol.asyncIterator]: () => open()[Symbol.asyncIterator](),
    [REPLAY]: open,
    ...(ranged !== undefined ? { [RANGED]: ranged } : {}),
  };
}

/** How to read `data` from any offset, if it can be. */
export function rangedOf(data: AsyncIterable<Uint8Array>): Ranged | undefined {
  return (data as { [RANGED]?: Ranged })[RANGED];
}

/** How to read `data` again from its start, if it can be. */
export function replayOf<T>(data: AsyncIterable<T>): (() => AsyncIterable<T>) | undefined {
  const open = (data as Partial<Replayable<T>>)[REPLAY];
  return typeof open === "function" ? open.bind(data) : undefined;
}
