/**
 * Cuts a stream of byte pieces, cut anywhere, into pieces of whole elements: the bytes of an element split
 * between two pieces are carried over (copied) and joined to the next piece. Every stream of decoded chunk
 * bytes that is read as elements (a cast, the export's cursors) goes through one.
 */
export class ElementAligner {
  private carry: Uint8Array | undefined;

  constructor(private readonly itemSize: number) {}

  /**
   * The whole elements `piece` completes, with what was carried before them (empty when it completes none).
   * The part of an element it leaves is copied, so `piece` need be valid only during the call; the result is
   * a view of `piece` where nothing was carried.
   */
  take(piece: Uint8Array): Uint8Array {
    let p = piece;
    if (this.carry !== undefined) {
      const joined = new Uint8Array(this.carry.length + p.length);
      joined.set(this.carry);
      joined.set(p, this.carry.length);
      p = joined;
      this.carry = undefined;
    }
    const whole = p.length - (p.length % this.itemSize);
    if (whole < p.length) this.carry = p.slice(whole);
    return p.subarray(0, whole);
  }

  /** Bytes of a partial element held for the next piece. */
  get carried(): number {
    return this.carry?.length ?? 0;
  }

  /** Drops what is carried (the stream starts again). */
  reset(): void {
    this.carry = undefined;
  }
}
