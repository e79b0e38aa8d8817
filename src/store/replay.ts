// A stream that can be read again from its start. A write that fails halfway through a streamed upload can
// only be retried if its bytes can be had again; a store's readStream can give them (it reopens the range),
// an arbitrary generator cannot. GcsStore.write retries streamed uploads only when the data is replayable.

const REPLAY = Symbol.for("orbax2reg.store.replay");

export interface Replayable<T> extends AsyncIterable<T> {
  [REPLAY](): AsyncIterable<T>;
}

/** An iterable whose every iteration calls `open` afresh. */
export function replayable<T>(open: () => AsyncIterable<T>): Replayable<T> {
  return {
    [Symbol.asyncIterator]: () => open()[Symbol.asyncIterator](),
    [REPLAY]: open,
  };
}

/** How to read `data` again from its start, if it can be. */
export function replayOf<T>(data: AsyncIterable<T>): (() => AsyncIterable<T>) | undefined {
  const open = (data as Partial<Replayable<T>>)[REPLAY];
  return typeof open === "function" ? open.bind(data) : undefined;
}
