import { describe, expect, test } from "vitest";
import { ElementAligner } from "../../src/util/elements.js";

const bytes = (n: number, from = 0) => Uint8Array.from({ length: n }, (_, i) => (from + i) & 0xff);

describe("ElementAligner", () => {
  test("a piece of whole elements comes out as it is, a view of the piece", () => {
    const a = new ElementAligner(4);
    const piece = bytes(12);
    const out = a.take(piece);
    expect(out).toEqual(piece);
    expect(out.buffer).toBe(piece.buffer);
    expect(a.carried).toBe(0);
  });

  test("an element split between two pieces is carried to the next and joined there", () => {
    const a = new ElementAligner(4);
    expect(a.take(bytes(6))).toEqual(bytes(4));
    expect(a.carried).toBe(2);
    expect(a.take(bytes(6, 6))).toEqual(bytes(8, 4));
    expect(a.carried).toBe(0);
  });

  test("a piece shorter than an element completes nothing and is carried whole", () => {
    const a = new ElementAligner(8);
    expect(a.take(bytes(3)).length).toBe(0);
    expect(a.take(bytes(3, 3)).length).toBe(0);
    expect(a.carried).toBe(6);
    expect(a.take(bytes(4, 6))).toEqual(bytes(8));
    expect(a.carried).toBe(2);
  });

  test("what is carried is a copy: the piece may change after the call", () => {
    const a = new ElementAligner(4);
    const piece = bytes(6);
    a.take(piece);
    piece.fill(0xee);
    expect(a.take(bytes(2, 6))).toEqual(bytes(4, 4));
  });

  test("the pieces joined are the stream's bytes, whatever the cuts", () => {
    const all = bytes(1000);
    for (const cut of [1, 3, 7, 64, 333]) {
      const a = new ElementAligner(4);
      const out: number[] = [];
      for (let at = 0; at < all.length; at += cut) {
        const piece = a.take(all.subarray(at, at + cut));
        expect(piece.length % 4).toBe(0);
        out.push(...piece);
      }
      expect(Uint8Array.from(out)).toEqual(all);
    }
  });

  test("reset drops what is carried", () => {
    const a = new ElementAligner(2);
    a.take(bytes(3));
    a.reset();
    expect(a.carried).toBe(0);
    expect(a.take(bytes(2, 9))).toEqual(bytes(2, 9));
  });
});
