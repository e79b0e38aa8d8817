// TensorStore-style round trips (like its *_codec_test.cc): each structure is encoded with the shared test
// encoder (test/helpers/ocdbt-encode.ts), decoded with src/ocdbt and compared; then a few targeted
// corruptions each, asserting the typed error and the byte offset it names. Offsets are computed from the
// encoder's field records, not hard-coded.
import { describe, expect, test } from "vitest";
import { ChecksumError, FormatError, type Orbax2RegError, UnsupportedError } from "../../src/errors.js";
import { type BtreeNode, decodeBtreeNode } from "../../src/ocdbt/btree.js";
import { ByteReader } from "../../src/ocdbt/byte-reader.js";
import { type DataFileId, decodeDataFileTable } from "../../src/ocdbt/data-file-table.js";
import { decodeEnvelope, type EnvelopeKind, MAGIC } from "../../src/ocdbt/envelope.js";
import { keyBytes } from "../../src/ocdbt/key.js";
import { decodeManifest } from "../../src/ocdbt/manifest.js";
import { type IndirectRef, readIndirectRefColumns, readStatsColumns, type SubtreeStats } from "../../src/ocdbt/node-reference.js";
import { decodeVersionEntries, decodeVersionNodeRefs, type VersionEntry, type VersionNodeRef } from "../../src/ocdbt/version-tree.js";
import {
  config,
  encodeBtreeNode,
  encodeEnvelope,
  encodeManifest,
  type Field,
  FieldWriter,
  type FileId,
  MISSING,
  type NodeRef,
  replaceField,
  type VersionNode,
  type VersionsManifest,
  varint,
  versionInteriorBody,
  versionLeafBody,
  writeDataFileTable,
  writeRefColumns,
  writeStatsColumns,
  zstdFrame,
} from "../helpers/ocdbt-encode.js";

const PATH = "mem://d/object";
/** A raw envelope's body starts after magic (4), length (8), version (1) and compression (1). */
const RAW_BODY_AT = 14;

/** The error `f` throws (fails the test if it returns). */
function thrown(f: () => unknown): Orbax2RegError {
  try {
    f();
  } catch (e) {
    return e as Orbax2RegError;
  }
  throw new Error("expected an error");
}

function field(w: FieldWriter | readonly Field[], name: string, nth = 0): Field {
  const fields = w instanceof FieldWriter ? w.fields : w;
  const f = fields.filter((x) => x.name === name)[nth];
  if (f === undefined) throw new Error(`no field ${name}#${nth}`);
  return f;
}

const id = (basePath: string, relativePath: string): DataFileId => ({ basePath, relativePath });
const stats = (numKeys: number, numTreeBytes: number, numIndirectValueBytes: number): SubtreeStats => ({
  numKeys,
  numTreeBytes,
  numIndirectValueBytes,
});

// ------------------------------------------------------------------------------------------------ manifest

const MANIFEST: VersionsManifest = {
  kind: "versions",
  config: {
    uuid: Uint8Array.from({ length: 16 }, (_, i) => i * 17),
    manifestKind: "single",
    maxInlineValueBytes: 100,
    maxDecodedNodeBytes: 8388608,
    versionTreeArityLog2: 2,
    compression: { method: "zstd", level: -3 },
  },
  inlineVersions: [
    { generation: 5, rootHeight: 0, root: null, stats: stats(0, 0, 0), commitTimeNs: 1n },
    {
      generation: 6,
      rootHeight: 2,
      root: { file: id("", "d/aaaa"), offset: 300, length: 81 },
      stats: stats(7, 900, 12),
      commitTimeNs: 0x181f95e1d3edf37cn,
    },
    {
      generation: 8,
      rootHeight: 1,
      root: { file: id("ocdbt.process_0/", "d/bbbb"), offset: 2 ** 40, length: 5 },
      stats: stats(1, 5, 0),
      commitTimeNs: (1n << 64n) - 1n,
    },
  ],
  versionNodes: [
    { generation: 4, ref: { file: id("", "d/aaaa"), offset: 0, length: 64 }, numGenerations: 4, commitTimeNs: 99n, height: 0 },
    { generation: 3, ref: { file: id("", "d/cccc"), offset: 64, length: 200 }, numGenerations: 16, commitTimeNs: 7n, height: 1 },
  ],
};

const decodeManifestObject = (bytes: Uint8Array) => decodeManifest(decodeEnvelope(bytes, "manifest", PATH, 1 << 20));
const rawManifest = (body: Uint8Array) => encodeEnvelope("manifest", body, { compression: 0 });

describe("manifest round trip", () => {
  test("a manifest with inline versions, an empty tree and version nodes decodes to what was encoded", () => {
    const body = encodeManifest(MANIFEST).finish();
    expect(decodeManifestObject(rawManifest(body))).toEqual(MANIFEST);
  });

  test("the same manifest in a zstd envelope decodes to what was encoded", () => {
    const body = encodeManifest(MANIFEST).finish();
    expect(decodeManifestObject(encodeEnvelope("manifest", zstdFrame(body), { compression: 1 }))).toEqual(MANIFEST);
  });

  test("an uncompressed-config manifest (compression_method 0) round-trips", () => {
    const m: VersionsManifest = { ...MANIFEST, config: { ...MANIFEST.config, compression: { method: "none" } } };
    expect(decodeManifestObject(rawManifest(encodeManifest(m).finish()))).toEqual(m);
  });

  test("a numbered manifest.ocdbt decodes as config-only", () => {
    const m = decodeManifestObject(rawManifest(config({ kind: 1, arityLog2: 3, zstdLevel: null })));
    expect(m).toEqual({
      kind: "config-only",
      config: {
        uuid: new Uint8Array(16).fill(0xab),
        manifestKind: "numbered",
        maxInlineValueBytes: 100,
        maxDecodedNodeBytes: 8388608,
        versionTreeArityLog2: 3,
        compression: { method: "none" },
      },
    });
  });

  test("wrong magic is a FormatError at offset 0", () => {
    const e = thrown(() =>
      decodeManifestObject(encodeEnvelope("manifest", encodeManifest(MANIFEST).finish(), { compression: 0, magic: MAGIC.btreeNode })),
    );
    expect(e).toBeInstanceOf(FormatError);
    expect(e.offset).toBe(0);
    expect(e.detail).toMatch(/bad magic 0x0cdb20de for manifest/);
  });

  test("format version 1 is an UnsupportedError at offset 12", () => {
    const e = thrown(() =>
      decodeManifestObject(encodeEnvelope("manifest", encodeManifest(MANIFEST).finish(), { compression: 0, versionBytes: [1] })),
    );
    expect(e).toBeInstanceOf(UnsupportedError);
    expect(e.offset).toBe(12);
  });

  test("a bad CRC is a ChecksumError at the checksum's offset", () => {
    const bytes = encodeEnvelope("manifest", encodeManifest(MANIFEST).finish(), { compression: 0, badCrc: true });
    const e = thrown(() => decodeManifestObject(bytes));
    expect(e).toBeInstanceOf(ChecksumError);
    expect(e.offset).toBe(bytes.length - 4);
  });

  test("a manifest cut short (length field kept) is a FormatError at the length field", () => {
    const bytes = rawManifest(encodeManifest(MANIFEST).finish());
    const e = thrown(() => decodeManifestObject(bytes.subarray(0, bytes.length - 10)));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.offset).toBe(4);
  });

  test("a body cut inside the commit times (resealed) is a FormatError at the first missing byte", () => {
    const w = encodeManifest(MANIFEST);
    const cut = field(w, "commit_time", 2).start + 3;
    const e = thrown(() => decodeManifestObject(rawManifest(w.finish().subarray(0, cut))));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.detail).toMatch(/truncated: commit_time needs 8 bytes, 3 left/);
    expect(e.offset).toBe(RAW_BODY_AT + cut - 3);
  });

  test("manifest_kind 2 is a FormatError at that byte", () => {
    const w = encodeManifest(MANIFEST);
    const f = field(w, "manifest_kind");
    const e = thrown(() => decodeManifestObject(rawManifest(replaceField(w.finish(), f, [2]))));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.offset).toBe(RAW_BODY_AT + f.start);
  });

  test("a version-tree arity of 0 is a FormatError at that byte", () => {
    const w = encodeManifest(MANIFEST);
    const f = field(w, "version_tree_arity_log2");
    const e = thrown(() => decodeManifestObject(rawManifest(replaceField(w.finish(), f, [0]))));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.offset).toBe(RAW_BODY_AT + f.start);
  });

  test("a generation number not above the previous one is a FormatError at that generation", () => {
    const versions = MANIFEST.inlineVersions.map((v, i) => (i === 2 ? { ...v, generation: 6 } : v));
    const w = encodeManifest({ ...MANIFEST, inlineVersions: versions });
    const e = thrown(() => decodeManifestObject(rawManifest(w.finish())));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.detail).toMatch(/generation numbers not increasing \(6\)/);
    expect(e.offset).toBe(RAW_BODY_AT + field(w, "generation_number", 2).start);
  });

  test("the zstd body's errors name the payload offset and the position in the decompressed body", () => {
    const w = encodeManifest(MANIFEST);
    const f = field(w, "manifest_kind");
    const bytes = encodeEnvelope("manifest", zstdFrame(replaceField(w.finish(), f, [7])), { compression: 1 });
    const e = thrown(() => decodeManifestObject(bytes));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.offset).toBe(RAW_BODY_AT);
    expect(e.detail).toContain(`(at byte ${f.start} of the decompressed body)`);
  });
});

// ------------------------------------------------------------------------------------------------ version tree node

// src/ocdbt has no whole-node decoder for version-tree nodes (nothing reads them: the newest version is
// always inline in the manifest), so a node body is read here with the src decoders of its parts, in the
// spec's order: arity (u8), height (u8), data file table, then version entries (leaf) or child refs.
type VersionTreeNode = { height: 0; versions: VersionEntry[] } | { height: number; children: VersionNodeRef[] };

const VLEAF: VersionTreeNode = {
  height: 0,
  versions: [
    {
      generation: 1,
      rootHeight: 0,
      root: { file: id("x/", "d/1"), offset: 0, length: 40 },
      stats: stats(2, 40, 0),
      commitTimeNs: 10n,
    },
    { generation: 2, rootHeight: 0, root: null, stats: stats(0, 0, 0), commitTimeNs: 20n },
    {
      generation: 4,
      rootHeight: 3,
      root: { file: id("x/p/", "d/2"), offset: 1000, length: 77 },
      stats: stats(9, 400, 30),
      commitTimeNs: 40n,
    },
  ],
};

function decodeVersionNode(body: Uint8Array, arity = 2, transitive = "x/"): VersionTreeNode {
  const r = new ByteReader(body, PATH);
  r.u8("version_tree_arity_log2");
  const height = r.u8("height");
  const files = decodeDataFileTable(r, transitive);
  const node: VersionTreeNode =
    height === 0
      ? { height: 0, versions: decodeVersionEntries(r, files, arity) }
      : { height, children: decodeVersionNodeRefs(r, files, { inManifest: false, childHeight: height - 1 }, 2 ** arity) };
  r.expectEnd("version tree node");
  return node;
}

/** VLEAF's body under transitive path "x/": the data file table is relative to it. */
const vleafBody = () =>
  versionLeafBody(
    2,
    [
      ["", "d/1"],
      ["p/", "d/2"],
    ],
    [
      { generation: 1, file: 0, offset: 0, length: 40, numKeys: 2, numTreeBytes: 40, commitTimeNs: 10n },
      { generation: 2, file: 0, offset: MISSING, length: MISSING, commitTimeNs: 20n },
      {
        generation: 4,
        rootHeight: 3,
        file: 1,
        offset: 1000,
        length: 77,
        numKeys: 9,
        numTreeBytes: 400,
        numIndirectValueBytes: 30,
        commitTimeNs: 40n,
      },
    ],
  );

const CHILDREN: VersionNode[] = [
  { generation: 4, file: 0, offset: 0, length: 90, numGenerations: 4, commitTimeNs: 5n },
  { generation: 8, file: 1, offset: 90, length: 91, numGenerations: 4, commitTimeNs: 6n },
];

describe("version tree node round trip", () => {
  test("a leaf decodes to the versions encoded, roots under the transitive path", () => {
    expect(decodeVersionNode(vleafBody())).toEqual(VLEAF);
  });

  test("an interior node decodes to its children, each one level lower", () => {
    const body = versionInteriorBody(
      2,
      2,
      [
        ["", "d/1"],
        ["", "d/2"],
      ],
      CHILDREN,
    );
    expect(decodeVersionNode(body)).toEqual({
      height: 2,
      children: [
        { generation: 4, ref: { file: id("x/", "d/1"), offset: 0, length: 90 }, numGenerations: 4, commitTimeNs: 5n, height: 1 },
        { generation: 8, ref: { file: id("x/", "d/2"), offset: 90, length: 91 }, numGenerations: 4, commitTimeNs: 6n, height: 1 },
      ],
    });
  });

  test("the leaf decodes through a versionTreeNode envelope", () => {
    const bytes = encodeEnvelope("versionTreeNode", zstdFrame(vleafBody()), { compression: 1 });
    expect(decodeVersionNode(decodeEnvelope(bytes, "versionTreeNode", PATH, 1 << 20).bytes)).toEqual(VLEAF);
  });

  test("a manifest magic on a version node is a FormatError at offset 0", () => {
    const bytes = encodeEnvelope("versionTreeNode", vleafBody(), { compression: 0, magic: MAGIC.manifest });
    const e = thrown(() => decodeEnvelope(bytes, "versionTreeNode", PATH, 1 << 20));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.offset).toBe(0);
  });

  test("more versions than the arity allows is a FormatError at the count", () => {
    const w = new FieldWriter();
    w.u8(1, "version_tree_arity_log2");
    w.u8(0, "height");
    writeDataFileTable(w, [["", "d/1"]]);
    w.varint(3, "version count");
    const e = thrown(() => decodeVersionNode(w.finish(), 1));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.detail).toMatch(/version count 3 exceeds the limit 2/);
    expect(e.offset).toBe(field(w, "version count").start);
  });

  test("a body cut short is a FormatError at the end of what is there", () => {
    const body = vleafBody();
    const e = thrown(() => decodeVersionNode(body.subarray(0, body.length - 1)));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.detail).toMatch(/truncated: commit_time needs 8 bytes, 7 left/);
    expect(e.offset).toBe(body.length - 8);
  });

  test("trailing bytes after the last version are a FormatError at the first of them", () => {
    const body = vleafBody();
    const e = thrown(() => decodeVersionNode(Uint8Array.from([...body, 0])));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.offset).toBe(body.length);
  });

  test("generation number 0 is a FormatError at that generation", () => {
    const w = new FieldWriter();
    w.u8(2, "version_tree_arity_log2");
    w.u8(0, "height");
    writeDataFileTable(w, [["", "d/1"]]);
    w.varint(1, "version count");
    w.varint(0, "generation_number");
    const e = thrown(() => decodeVersionNode(w.finish()));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.detail).toMatch(/generation_number 0 is not allowed/);
    expect(e.offset).toBe(field(w, "generation_number").start);
  });

  test("an empty-tree version with a non-zero height is a FormatError", () => {
    const body = versionLeafBody(2, [["", "d/1"]], [{ generation: 1, rootHeight: 1, file: 0, offset: MISSING, length: MISSING }]);
    expect(thrown(() => decodeVersionNode(body))).toBeInstanceOf(FormatError);
  });
});

// ------------------------------------------------------------------------------------------------ b+tree node

const k = keyBytes;
const PREFIX = k("model/");

const LEAF_NODE: BtreeNode = {
  height: 0,
  entries: [
    { key: k("model/a"), value: { kind: "inline", bytes: k("abc") } },
    { key: k("model/ab"), value: { kind: "indirect", ref: { file: id("t/", "d/big"), offset: 12, length: 3000 } } },
    { key: k("model/b\u0001"), value: { kind: "inline", bytes: new Uint8Array(0) } },
    { key: k("model/bz"), value: { kind: "indirect", ref: { file: id("t/sub/", "d/other"), offset: 0, length: 1 } } },
    { key: k("model/c"), value: { kind: "indirect", ref: { file: id("t/", "d/big"), offset: 3012, length: 9 } } },
  ],
};

const INTERIOR_NODE: BtreeNode = {
  height: 3,
  entries: [
    {
      key: k("model/"),
      childPrefix: k("model/"),
      ref: { file: id("t/", "d/n1"), offset: 0, length: 100 },
      stats: stats(10, 1000, 0),
    },
    {
      key: k("model/layer1/w"),
      childPrefix: k("model/layer1/"),
      ref: { file: id("t/", "d/n2"), offset: 100, length: 2 ** 33 },
      stats: stats(3, 2 ** 33, 77),
    },
    {
      key: k("model/layer2"),
      childPrefix: k("model/layer2"),
      ref: { file: id("t/", "d/n1"), offset: 5, length: 6 },
      stats: stats(1, 6, 0),
    },
  ],
};

const decodeNode = (body: Uint8Array, height = 0, prefix = PREFIX, transitive = "t/") =>
  decodeBtreeNode(new ByteReader(body, PATH), prefix, transitive, height);

describe("b+tree node round trip", () => {
  test("a leaf with inline and out-of-line values decodes to what was encoded", () => {
    expect(decodeNode(encodeBtreeNode(LEAF_NODE, PREFIX, "t/").finish())).toEqual(LEAF_NODE);
  });

  test("an interior node with subtree prefixes and statistics decodes to what was encoded", () => {
    expect(decodeNode(encodeBtreeNode(INTERIOR_NODE, PREFIX, "t/").finish(), 3)).toEqual(INTERIOR_NODE);
  });

  test("a leaf decodes through a btreeNode envelope, zstd or raw", () => {
    const body = encodeBtreeNode(LEAF_NODE, PREFIX, "t/").finish();
    for (const bytes of [
      encodeEnvelope("btreeNode", zstdFrame(body), { compression: 1 }),
      encodeEnvelope("btreeNode", body, { compression: 0 }),
    ]) {
      expect(decodeBtreeNode(decodeEnvelope(bytes, "btreeNode", PATH, 1 << 20), PREFIX, "t/", 0)).toEqual(LEAF_NODE);
    }
  });

  test("a version-node magic on a b+tree node is a FormatError at offset 0", () => {
    const bytes = encodeEnvelope("btreeNode", encodeBtreeNode(LEAF_NODE, PREFIX, "t/").finish(), {
      compression: 0,
      magic: MAGIC.versionTreeNode,
    });
    const e = thrown(() => decodeEnvelope(bytes, "btreeNode", PATH, 1 << 20));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.offset).toBe(0);
  });

  test("a bad CRC on a node stored at an offset in its data file names the file offset of the checksum", () => {
    const bytes = encodeEnvelope("btreeNode", encodeBtreeNode(LEAF_NODE, PREFIX, "t/").finish(), { compression: 0, badCrc: true });
    const e = thrown(() => decodeEnvelope(bytes, "btreeNode", PATH, 1 << 20, 5000));
    expect(e).toBeInstanceOf(ChecksumError);
    expect(e.offset).toBe(5000 + bytes.length - 4);
  });

  test("an error in a raw node stored at an offset is reported at its file offset", () => {
    const w = encodeBtreeNode(LEAF_NODE, PREFIX, "t/");
    const f = field(w, "value kind", 1);
    const bytes = encodeEnvelope("btreeNode", replaceField(w.finish(), f, [2]), { compression: 0 });
    const e = thrown(() => decodeBtreeNode(decodeEnvelope(bytes, "btreeNode", PATH, 1 << 20, 5000), PREFIX, "t/", 0));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.offset).toBe(5000 + RAW_BODY_AT + f.start);
  });

  test("a value kind of 2 is a FormatError at that byte", () => {
    const w = encodeBtreeNode(LEAF_NODE, PREFIX, "t/");
    const f = field(w, "value kind", 2);
    const e = thrown(() => decodeNode(replaceField(w.finish(), f, [2])));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.offset).toBe(f.start);
  });

  test("a key suffix that breaks the order is a FormatError at that suffix", () => {
    const w = encodeBtreeNode(LEAF_NODE, PREFIX, "t/");
    const f = field(w, "key suffix", 4); // "c" after "bz"
    const e = thrown(() => decodeNode(replaceField(w.finish(), f, k("a"))));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.detail).toMatch(/key 4: keys are not strictly increasing/);
    expect(e.offset).toBe(f.start);
  });

  test("a value file index past the table is a FormatError at the index", () => {
    const w = encodeBtreeNode(LEAF_NODE, PREFIX, "t/");
    const f = field(w, "value data file index", 1);
    const e = thrown(() => decodeNode(replaceField(w.finish(), f, [9])));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.offset).toBe(f.start);
  });

  test("an interior node cut inside its statistics is a FormatError at the cut", () => {
    const body = encodeBtreeNode(INTERIOR_NODE, PREFIX, "t/").finish();
    const e = thrown(() => decodeNode(body.subarray(0, body.length - 1), 3));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.detail).toMatch(/truncated varint \(child num_indirect_value_bytes\)/);
    expect(e.offset).toBe(body.length - 1);
  });

  test("a subtree prefix longer than its key is a FormatError", () => {
    const w = encodeBtreeNode(INTERIOR_NODE, PREFIX, "t/");
    const f = field(w, "subtree common prefix length", 2);
    const e = thrown(() => decodeNode(replaceField(w.finish(), f, [7]), 3));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.detail).toMatch(/entry 2: subtree common prefix length 7 exceeds key length 6/);
  });

  test("the encoder refuses a key outside the node's prefix", () => {
    expect(() => encodeBtreeNode(LEAF_NODE, k("other/"), "t/")).toThrow(/outside the node's prefix/);
  });
});

// ------------------------------------------------------------------------------------------------ data file table

const decodeTable = (bytes: Uint8Array, transitive = "") => {
  const r = new ByteReader(bytes, PATH);
  const files = decodeDataFileTable(r, transitive);
  r.expectEnd("table");
  return files;
};
const tableOf = (files: readonly FileId[]) => {
  const w = new FieldWriter();
  writeDataFileTable(w, files);
  return w;
};

const TABLES: [string, FileId[]][] = [
  ["no files", []],
  ["one empty path", [["", ""]]],
  [
    "files sharing a base path and a relative prefix",
    [
      ["ocdbt.process_0/", "d/aaaa"],
      ["ocdbt.process_0/", "d/aabb"],
      ["ocdbt.process_0/", "d/b"],
    ],
  ],
  [
    "base paths that share only part of themselves",
    [
      ["ocdbt.process_0/", "d/x"],
      ["ocdbt.process_1/", "d/x"],
      ["ocdbt.process_10/", "d/x"],
      ["", "d/x"],
    ],
  ],
  ["non-ASCII paths", [["über/", "d/ß"]]],
];

describe("data file table round trip", () => {
  test.each(TABLES)("%s", (_, files) => {
    expect(decodeTable(tableOf(files).finish())).toEqual(files.map(([b, r]) => id(b, r)));
  });

  test("the transitive path is prepended to every decoded base path", () => {
    const files: FileId[] = [
      ["", "d/a"],
      ["p/", "d/a"],
    ];
    expect(decodeTable(tableOf(files).finish(), "root/")).toEqual([id("root/", "d/a"), id("root/p/", "d/a")]);
  });

  test("a prefix crossing differing base paths is a FormatError at the first suffix", () => {
    const w = tableOf([
      ["ab/", "x"],
      ["abc/", "x"],
    ]);
    const f = field(w, "data file path prefix length");
    const bytes = replaceField(w.finish(), f, [4]); // "ab/x" reaches past the shared "ab"
    const e = thrown(() => decodeTable(bytes));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.detail).toMatch(/data file 1: path prefix crosses differing base paths/);
    expect(e.offset).toBe(field(w, "data file path suffix", 1).start);
  });

  test("a base path longer than the path is a FormatError", () => {
    const w = tableOf([["ab/", "x"]]);
    const bytes = replaceField(w.finish(), field(w, "data file base path length"), [5]);
    const e = thrown(() => decodeTable(bytes));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.detail).toMatch(/base path length 5 exceeds path length 4/);
  });

  test("a table cut inside a suffix is a FormatError at that suffix", () => {
    const w = tableOf([
      ["", "d/aaaa"],
      ["", "d/bbbb"],
    ]);
    const bytes = w.finish();
    const e = thrown(() => decodeTable(bytes.subarray(0, bytes.length - 2)));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.detail).toMatch(/truncated: data file path suffix/);
    expect(e.offset).toBe(field(w, "data file path suffix", 1).start);
  });

  test("a file count larger than the bytes allow is a FormatError at the count", () => {
    const e = thrown(() => decodeTable(Uint8Array.from([...varint(1000), 0, 0])));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.offset).toBe(0);
  });
});

// ------------------------------------------------------------------------------------------------ node reference

const FILES = [id("", "d/a"), id("p/", "d/b")];
const REFS: NodeRef[] = [
  { file: 0, offset: 0, length: 1, numKeys: 1, numTreeBytes: 1 },
  { file: 1, offset: 2 ** 45, length: 2 ** 20, numKeys: 300, numTreeBytes: 2 ** 20, numIndirectValueBytes: 5 },
  { file: 0, offset: 127, length: 128 },
];

function refBytes(refs: readonly NodeRef[], withStats = true): FieldWriter {
  const w = new FieldWriter();
  writeRefColumns(w, refs, "child");
  if (withStats) writeStatsColumns(w, refs, "child");
  return w;
}

function readRefs(bytes: Uint8Array, n: number, allowMissing = false): { refs: (IndirectRef | null)[]; stats: SubtreeStats[] } {
  const r = new ByteReader(bytes, PATH);
  const refs = readIndirectRefColumns(r, n, FILES, allowMissing, "child");
  const s = readStatsColumns(r, n, "child");
  r.expectEnd("references");
  return { refs, stats: s };
}

describe("node reference round trip", () => {
  test("references and their statistics decode to what was encoded, in column order", () => {
    expect(readRefs(refBytes(REFS).finish(), 3)).toEqual({
      refs: [
        { file: FILES[0], offset: 0, length: 1 },
        { file: FILES[1], offset: 2 ** 45, length: 2 ** 20 },
        { file: FILES[0], offset: 127, length: 128 },
      ],
      stats: [stats(1, 1, 0), stats(300, 2 ** 20, 5), stats(0, 0, 0)],
    });
  });

  test("the empty-tree marker decodes to null where it is allowed", () => {
    const w = refBytes([{ file: 0, offset: MISSING, length: MISSING }]);
    expect(readRefs(w.finish(), 1, true).refs).toEqual([null]);
  });

  test("the empty-tree marker where it is not allowed is a FormatError at its length", () => {
    const w = refBytes([REFS[0] as NodeRef, { file: 0, offset: MISSING, length: MISSING }]);
    const e = thrown(() => readRefs(w.finish(), 2));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.detail).toMatch(/child 1: empty-tree marker/);
    expect(e.offset).toBe(field(w, "child length", 1).start);
  });

  test("a byte range past 2^53 is a FormatError at its length", () => {
    const w = refBytes([{ file: 0, offset: 2n ** 53n, length: 1 }]);
    const e = thrown(() => readRefs(w.finish(), 1));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.detail).toMatch(/byte range .* is out of range/);
    expect(e.offset).toBe(field(w, "child length").start);
  });

  test("a file index past the table is a FormatError at the index", () => {
    const w = refBytes([REFS[0] as NodeRef, { ...(REFS[2] as NodeRef), file: 2 }]);
    const e = thrown(() => readRefs(w.finish(), 2));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.detail).toMatch(/child data file index 2 is past the data file table \(2 entries\)/);
    expect(e.offset).toBe(field(w, "child data file index", 1).start);
  });

  test("statistics cut short are a FormatError at the missing varint", () => {
    const bytes = refBytes(REFS).finish();
    const e = thrown(() => readRefs(bytes.subarray(0, bytes.length - 1), 3));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.offset).toBe(bytes.length - 1);
  });

  test("an offset varint longer than 10 bytes is a FormatError at its first byte", () => {
    const w = refBytes([REFS[0] as NodeRef]);
    const f = field(w, "child offset");
    const e = thrown(() => readRefs(replaceField(w.finish(), f, [...new Array(10).fill(0x80), 0]), 1));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.detail).toMatch(/varint longer than 10 bytes/);
    expect(e.offset).toBe(f.start);
  });
});

test.each(Object.keys(MAGIC) as EnvelopeKind[])("an empty-bodied %s envelope decodes to an empty raw body", (kind) => {
  const r = decodeEnvelope(encodeEnvelope(kind, new Uint8Array(0), { compression: 0 }), kind, PATH, 1 << 20);
  expect(r.remaining).toBe(0);
});
