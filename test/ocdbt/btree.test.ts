import { readFileSync } from "node:fs";
import { describe, expect, test } from "vitest";
import { FormatError } from "../../src/errors.js";
import { type BtreeNode, decodeBtreeNode, type InteriorEntry, type LeafEntry } from "../../src/ocdbt/btree.js";
import { ByteReader } from "../../src/ocdbt/byte-reader.js";
import { decodeEnvelope } from "../../src/ocdbt/envelope.js";
import { keyString } from "../../src/ocdbt/key.js";
import { decodeManifest } from "../../src/ocdbt/manifest.js";
import type { IndirectRef } from "../../src/ocdbt/node-reference.js";
import {
  cat,
  type InteriorEntry as EncInterior,
  type LeafEntry as EncLeaf,
  interiorBody,
  leafBody,
  MISSING,
} from "../helpers/ocdbt-encode.js";
import { FIXTURES } from "../helpers/paths.js";

const NG = `${FIXTURES}/ocdbt-neuroglancer`;
const LEAF_FILE = `${NG}/files_high_arity.ocdbt/d/9b07a9a00a1a562b1c801f1d164a90c6`;
const te = new TextEncoder();
const NO_PREFIX = new Uint8Array(0);

const decode = (body: Uint8Array, height = 0, prefix = NO_PREFIX, transitive = "") =>
  decodeBtreeNode(new ByteReader(body, "mem://d/node"), prefix, transitive, height);
const leaf = (entries: EncLeaf[], prefix = NO_PREFIX) => decode(leafBody([], entries), 0, prefix).entries as LeafEntry[];
const inline = (key: string, value = "") => ({ key, value: te.encode(value) });
const text = (e: LeafEntry) => [keyString(e.key), e.value.kind === "inline" ? keyString(e.value.bytes) : e.value];

/** The §9 leaf: 8 keys, all values inline. */
const DOC_LEAF: EncLeaf[] = [
  inline("#"),
  inline("a", "abc"),
  inline("b", "abc"),
  inline("baz/first"),
  inline("baz/x"),
  inline("baz/z"),
  inline("c", "bar"),
  inline("empty"),
];

describe("b-tree leaf nodes", () => {
  test("the doc §9 leaf body decodes to its 8 keys with inline values", () => {
    const body = decodeEnvelope(new Uint8Array(readFileSync(LEAF_FILE)), "btreeNode", LEAF_FILE, 1 << 20);
    expect(body.remaining).toBe(62);
    const node = decodeBtreeNode(body, NO_PREFIX, "", 0);
    expect((node.entries as LeafEntry[]).map(text)).toEqual(DOC_LEAF.map((e) => [e.key, keyString(e.value as Uint8Array)]));
  });

  test("the test encoder reproduces the §9 leaf body byte for byte", () => {
    const body = decodeEnvelope(new Uint8Array(readFileSync(LEAF_FILE)), "btreeNode", LEAF_FILE, 1 << 20);
    expect(Buffer.from(leafBody([], DOC_LEAF)).toString("hex")).toBe(Buffer.from(body.take(62, "body")).toString("hex"));
  });

  test("a small leaf's keys hold only their own bytes (every cached node would otherwise cost a slab)", () => {
    const entries = leaf([inline("first"), inline("x")], te.encode("baz/"));
    for (const e of entries) expect(e.key.buffer.byteLength).toBe("baz/first".length + "baz/x".length);
  });

  test("a large leaf's keys share slabs of at most 1 MiB instead of a buffer each", () => {
    const many = Array.from({ length: 50_000 }, (_, i) => inline(`model.decoder.layer${String(i).padStart(6, "0")}/0.0`));
    const keys = leaf(many).map((e) => e.key);
    const buffers = new Set(keys.map((k) => k.buffer));
    expect(buffers.size).toBeLessThanOrEqual(2);
    for (const b of buffers) expect(b.byteLength).toBeLessThanOrEqual(1 << 20);
    expect(keyString(keys[49_999] as Uint8Array)).toBe("model.decoder.layer049999/0.0");
  });

  test("keys get the node's implicit prefix", () => {
    expect(leaf([inline("first"), inline("x")], te.encode("baz/")).map(text)).toEqual([
      ["baz/first", ""],
      ["baz/x", ""],
    ]);
  });

  test("an out-of-line value is a (file, offset, length) reference under the node's transitive path", () => {
    const body = leafBody(
      [["", "d/aa"]],
      [
        { key: "k1", value: { file: 0, offset: 9, length: 3 } },
        { key: "k2", value: te.encode("in") },
        { key: "k3", value: { file: 0, offset: 0, length: 9 } },
      ],
    );
    const entries = decode(body, 0, NO_PREFIX, "ocdbt.process_0/").entries as LeafEntry[];
    const file = { basePath: "ocdbt.process_0/", relativePath: "d/aa" };
    expect(entries.map((e) => e.value)).toEqual([
      { kind: "indirect", ref: { file, offset: 9, length: 3 } },
      { kind: "inline", bytes: te.encode("in") },
      { kind: "indirect", ref: { file, offset: 0, length: 9 } },
    ]);
  });

  test("keys that are not strictly increasing are rejected", () => {
    expect(() => leaf([inline("b"), inline("a")])).toThrow(/key 1: keys are not strictly increasing/);
  });

  test("a repeated key is rejected", () => {
    expect(() => leaf([inline("a"), inline("a")])).toThrow(FormatError);
  });

  test("a key prefix longer than the previous key is rejected", () => {
    // Height 0, no files, 2 entries; key 1 claims 5 bytes of key 0, which is "a".
    const body = cat([0, 0, 2, 5, 1, 1], "ab", [0, 0, 0, 0]);
    expect(() => decode(body)).toThrow(/key 1: prefix length 5 exceeds previous key length 1/);
  });

  test("a value kind above 1 is rejected", () => {
    expect(() => leaf([{ key: "a", value: te.encode("x"), kind: 2 }])).toThrow(/value kind 2 \(0 = inline, 1 = out-of-line\)/);
  });

  test("an empty node is rejected", () => {
    expect(() => decode(leafBody([], []))).toThrow(/empty b-tree node/);
  });

  test("a height other than the expected one is rejected at offset 0", () => {
    let error: unknown;
    try {
      decode(leafBody([], [inline("a")]), 1);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(FormatError);
    expect((error as FormatError).message).toMatch(/^mem:\/\/d\/node, offset 0: b-tree node height 0, expected 1/);
  });

  test("a value file index past the node's table is rejected", () => {
    expect(() => leaf([{ key: "a", value: { file: 0, offset: 0, length: 1 } }])).toThrow(
      /value data file index 0 is past the data file table/,
    );
  });

  test("trailing bytes after the inline values are rejected", () => {
    expect(() => decode(cat(leafBody([], [inline("a", "v")]), [0]))).toThrow(/trailing bytes after b-tree leaf node/);
  });

  test("inline values cut short are a FormatError", () => {
    const body = leafBody([], [inline("a", "value")]);
    expect(() => decode(body.subarray(0, body.length - 2))).toThrow(/truncated: inline value needs 5 bytes, 3 left/);
  });
});

describe("b-tree interior nodes", () => {
  const child = (key: string, subtreePrefixLength: number, offset = 0): EncInterior => ({
    key,
    subtreePrefixLength,
    file: 0,
    offset,
    length: 10,
    numKeys: 1,
  });

  test("a subtree common prefix gives the child its implicit prefix", () => {
    const node = decode(interiorBody(1, [["", "d/n"]], [child("a", 0), child("baz/first", 4, 10), child("c", 1, 20)]), 1, te.encode("p/"));
    const entries = node.entries as InteriorEntry[];
    expect(entries.map((e) => [keyString(e.key), keyString(e.childPrefix), e.ref.offset])).toEqual([
      ["p/a", "p/", 0],
      ["p/baz/first", "p/baz/", 10],
      ["p/c", "p/c", 20],
    ]);
  });

  test("child references resolve under the transitive path", () => {
    const node = decode(interiorBody(2, [["sub/", "d/n"]], [child("a", 0)]), 2, NO_PREFIX, "ocdbt.process_1/");
    expect((node.entries[0] as InteriorEntry).ref.file).toEqual({ basePath: "ocdbt.process_1/sub/", relativePath: "d/n" });
  });

  test("a subtree common prefix longer than the key is rejected", () => {
    expect(() => decode(interiorBody(1, [["", "d/n"]], [child("ab", 3)]), 1)).toThrow(
      /subtree common prefix length 3 exceeds key length 2/,
    );
  });

  test("the empty-tree marker is not a valid child reference", () => {
    const body = interiorBody(1, [["", ""]], [{ key: "a", file: 0, offset: MISSING, length: MISSING }]);
    expect(() => decode(body, 1)).toThrow(/empty-tree marker is only allowed in version entries/);
  });
});

describe("files_min_arity (root height 3, many subtree prefixes)", () => {
  const dir = `${NG}/files_min_arity.ocdbt`;

  function readNode(ref: IndirectRef, prefix: Uint8Array, height: number): BtreeNode {
    const path = `${dir}/${ref.file.basePath}${ref.file.relativePath}`;
    const bytes = new Uint8Array(readFileSync(path)).subarray(ref.offset, ref.offset + ref.length);
    return decodeBtreeNode(decodeEnvelope(bytes, "btreeNode", path, 1 << 20, ref.offset), prefix, ref.file.basePath, height);
  }

  /** Walks the whole tree, checking that each child's keys carry its implicit prefix and respect its lower bound. */
  function walk(ref: IndirectRef, prefix: Uint8Array, height: number, out: { keys: string[]; prefixed: number }): void {
    const node = readNode(ref, prefix, height);
    if (node.height === 0) {
      for (const e of node.entries as LeafEntry[]) out.keys.push(keyString(e.key));
      return;
    }
    for (const e of node.entries as InteriorEntry[]) {
      if (e.childPrefix.length > prefix.length) out.prefixed++;
      const first = out.keys.length;
      walk(e.ref, e.childPrefix, height - 1, out);
      const childKeys = out.keys.slice(first);
      expect(childKeys.every((k) => k.startsWith(keyString(e.childPrefix)))).toBe(true);
      expect((childKeys[0] as string) >= keyString(e.key)).toBe(true);
    }
  }

  test("interior nodes give their children implicit prefixes, and the full keys come out in order", () => {
    const manifestPath = `${dir}/manifest.ocdbt`;
    const m = decodeManifest(decodeEnvelope(new Uint8Array(readFileSync(manifestPath)), "manifest", manifestPath, 1 << 20));
    if (m.kind !== "versions") throw new Error("expected versions");
    const v = m.inlineVersions[0];
    expect(v?.rootHeight).toBe(3);
    const out = { keys: [] as string[], prefixed: 0 };
    walk(v?.root as IndirectRef, NO_PREFIX, 3, out);
    expect(out.keys).toEqual(["#", "a", "b", "baz/first", "baz/x", "baz/z", "c", "empty"]);
    expect(out.prefixed).toBeGreaterThan(2);
  });
});
