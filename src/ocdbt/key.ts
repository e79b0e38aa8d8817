/** OCDBT keys are byte strings ordered by unsigned bytes, a proper prefix first (like std::string_view). */
export function compareKeys(a: Uint8Array, b: Uint8Array): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const d = (a[i] as number) - (b[i] as number);
    if (d !== 0) return d;
  }
  return a.length - b.length;
}

export function startsWith(key: Uint8Array, prefix: Uint8Array): boolean {
  if (prefix.length > key.length) return false;
  for (let i = 0; i < prefix.length; i++) if (key[i] !== prefix[i]) return false;
  return true;
}

export function concatBytes(a: Uint8Array, b: Uint8Array): Uint8Array {
  if (a.length === 0) return b;
  const out = new Uint8Array(a.length + b.length);
  out.set(a, 0);
  out.set(b, a.length);
  return out;
}

/**
 * The exclusive upper bound of all keys starting with `prefix` (TensorStore KeyRange::Prefix): the prefix
 * with its last non-0xFF byte incremented and what follows dropped; undefined when there is no bound.
 */
export function prefixUpperBound(prefix: Uint8Array): Uint8Array | undefined {
  let end = prefix.length;
  while (end > 0 && prefix[end - 1] === 0xff) end--;
  if (end === 0) return undefined;
  const out = prefix.slice(0, end);
  out[end - 1] = (out[end - 1] as number) + 1;
  return out;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8");
export const keyBytes = (key: string): Uint8Array => encoder.encode(key);
export const keyString = (key: Uint8Array): string => decoder.decode(key);
