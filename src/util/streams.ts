/**
 * Compares two streams of pieces (cut anywhere, each side its own way) without holding either whole. Resolves
 * to the offset of the first byte that differs, where one stream ends before the other included, or undefined
 * when they hold the same bytes. Stops reading both at the first difference (their iterators are returned).
 */
export async function firstDifference(a: AsyncIterable<Uint8Array>, b: AsyncIterable<Uint8Array>): Promise<number | undefined> {
  const ia = a[Symbol.asyncIterator]();
  const ib = b[Symbol.asyncIterator]();
  let pa: Uint8Array = new Uint8Array(0);
  let pb: Uint8Array = new Uint8Array(0);
  let endA = false;
  let endB = false;
  let at = 0;
  try {
    for (;;) {
      // Both pieces are refilled together, so that the two reads overlap.
      const [na, nb] = await Promise.all([
        pa.length === 0 && !endA ? ia.next() : undefined,
        pb.length === 0 && !endB ? ib.next() : undefined,
      ]);
      if (na !== undefined) {
        if (na.done) endA = true;
        else pa = na.value;
      }
      if (nb !== undefined) {
        if (nb.done) endB = true;
        else pb = nb.value;
      }
      if (pa.length === 0 && !endA) continue;
      if (pb.length === 0 && !endB) continue;
      if (pa.length === 0 || pb.length === 0) return pa.length === 0 && pb.length === 0 ? undefined : at;
      const n = Math.min(pa.length, pb.length);
      const x = pa.subarray(0, n);
      const y = pb.subarray(0, n);
      if (!Buffer.from(x.buffer, x.byteOffset, n).equals(y)) {
        let i = 0;
        while (x[i] === y[i]) i++;
        return at + i;
      }
      at += n;
      pa = pa.subarray(n);
      pb = pb.subarray(n);
    }
  } finally {
    // Whatever ended early stops its read (a GCS download is aborted); errors of the cleanup itself are moot.
    await Promise.allSettled([endA ? undefined : ia.return?.(), endB ? undefined : ib.return?.()]);
  }
}

/** `bytes` as a stream of one piece. */
export async function* once(bytes: Uint8Array): AsyncGenerator<Uint8Array> {
  yield bytes;
}
