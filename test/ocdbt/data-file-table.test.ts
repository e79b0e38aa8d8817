import { describe, expect, test } from "vitest";
import { FormatError } from "../../src/errors.js";
import { ByteReader } from "../../src/ocdbt/byte-reader.js";
import { type DataFileId, dataFilePath, decodeDataFileTable, readDataFileRef } from "../../src/ocdbt/data-file-table.js";
import { cat, dataFileTable, type FileId, varint } from "../helpers/ocdbt-encode.js";

const PATH = "mem://manifest.ocdbt";
const decode = (bytes: Uint8Array | number[], transitive = "") => {
  const r = new ByteReader(Uint8Array.from(bytes), PATH);
  const files = decodeDataFileTable(r, transitive);
  r.expectEnd("table");
  return files;
};
const ids = (files: readonly FileId[]): DataFileId[] => files.map(([basePath, relativePath]) => ({ basePath, relativePath }));

describe("data file table", () => {
  test("the doc's hand-made example encodes and decodes as documented", () => {
    const files: FileId[] = [
      ["p/", "d/aa"],
      ["p/", "d/ab"],
    ];
    const expected = cat([0x02, 0x05, 0x06, 0x01, 0x02, 0x02], "p/d/aa", "b");
    expect(dataFileTable(files)).toEqual(expected);
    expect(decode(expected)).toEqual(ids(files));
  });

  test("an empty table has no files", () => {
    expect(decode([0x00])).toEqual([]);
  });

  test("a single file with no base path", () => {
    expect(decode(cat([0x01, 0x04, 0x00], "d/ff"))).toEqual(ids([["", "d/ff"]]));
  });

  test("the empty data file id has an empty path", () => {
    expect(decode([0x01, 0x00, 0x00])).toEqual(ids([["", ""]]));
  });

  test("two files under the same non-empty base path (Neuroglancer's bug) keep their full relative paths", () => {
    // Prefix 18 = the 16-byte base path plus "d/": the shared prefix reaches into the relative path.
    const files: FileId[] = [
      ["ocdbt.process_0/", "d/0123abcd"],
      ["ocdbt.process_0/", "d/4567ef01"],
    ];
    const bytes = dataFileTable(files);
    expect([...bytes.subarray(0, 6)]).toEqual([0x02, 18, 26, 8, 16, 16]);
    const decoded = decode(bytes);
    expect(decoded).toEqual(ids(files));
    expect(decoded.map(dataFilePath)).toEqual(["ocdbt.process_0/d/0123abcd", "ocdbt.process_0/d/4567ef01"]);
  });

  test("files under different base paths share only the common part of the base paths", () => {
    const files: FileId[] = [
      ["", "d/00"],
      ["ocdbt.process_0/", "d/11"],
      ["ocdbt.process_0/", "d/12"],
      ["ocdbt.process_1/", "d/11"],
    ];
    expect(decode(dataFileTable(files))).toEqual(ids(files));
  });

  test("TensorStore's Prefixes table (empty paths, prefixes into and across base paths) round-trips", () => {
    // data_file_id_codec_test.cc DataFileBuilderTest.Prefixes, already in the builder's sorted order.
    const files: FileId[] = [
      ["", ""],
      ["", "a"],
      ["", "ab"],
      ["", "ac"],
      ["a", ""],
      ["a", "x"],
      ["a", "xy"],
      ["a", "xyz"],
      ["ab", ""],
      ["ab", "xy"],
      ["ab", "xyz"],
      ["ac", "xy"],
    ];
    expect(decode(dataFileTable(files))).toEqual(ids(files));
  });

  test("TensorStore's AddBasePath table decodes under transitive path x/", () => {
    const files: FileId[] = [
      ["", "y"],
      ["a", "b"],
      ["a", "c"],
      ["b", "d"],
      ["b", "e"],
    ];
    expect(decode(dataFileTable(files), "x/")).toEqual(
      ids([
        ["x/", "y"],
        ["x/a", "b"],
        ["x/a", "c"],
        ["x/b", "d"],
        ["x/b", "e"],
      ]),
    );
  });

  test("the transitive path is prepended to every base path", () => {
    const files: FileId[] = [
      ["", "d/aa"],
      ["sub/", "d/bb"],
    ];
    expect(decode(dataFileTable(files), "ocdbt.process_1/")).toEqual(
      ids([
        ["ocdbt.process_1/", "d/aa"],
        ["ocdbt.process_1/sub/", "d/bb"],
      ]),
    );
  });

  test("a prefix reaching past differing base paths is rejected", () => {
    // path0 = "p/d/aa" (base "p/"), path1 = "p/d/ab" but with base length 4 ("p/d/"): prefix 5 > min(2, 4).
    const bytes = cat([0x02, 0x05, 0x06, 0x01, 0x02, 0x04], "p/d/aa", "b");
    expect(() => decode(bytes)).toThrow(FormatError);
    expect(() => decode(bytes)).toThrow(/data file 1: path prefix crosses differing base paths/);
  });

  test("a prefix into a base path that differs from the previous (empty) one is rejected", () => {
    // TensorStore's PrefixLengthLongerThanPrevBasePath: base lengths 0 then 1, prefix 2.
    const bytes = cat([0x02, 0x02, 0x02, 0x00, 0x00, 0x01], "ab");
    expect(() => decode(bytes)).toThrow(/data file 1: path prefix crosses differing base paths/);
  });

  test("a prefix within the shorter base path may join differing base paths", () => {
    // "ab/x" (base "ab/") then "ac/y" (base "ac/"): prefix 1 <= min(3, 3).
    const bytes = cat([0x02, 0x01, 0x04, 0x03, 0x03, 0x03], "ab/x", "c/y");
    expect(decode(bytes)).toEqual(
      ids([
        ["ab/", "x"],
        ["ac/", "y"],
      ]),
    );
  });

  test("a prefix longer than the previous path is rejected", () => {
    const bytes = cat([0x02, 0x09, 0x02, 0x01, 0x00, 0x00], "d/", "x");
    expect(() => decode(bytes)).toThrow(/data file 1: prefix length 9 exceeds previous path length 2/);
  });

  test("a base path longer than the path is rejected", () => {
    expect(() => decode(cat([0x01, 0x02, 0x03], "d/"))).toThrow(/base path length 3 exceeds path length 2/);
  });

  test("a path longer than 65535 bytes with its transitive path is rejected", () => {
    const bytes = cat([0x01], varint(65530), [0x00], new Uint8Array(65530).fill(0x61));
    expect(decode(bytes)[0]?.relativePath.length).toBe(65530);
    expect(() => decode(bytes, "ocdbt.process_0/")).toThrow(/path length 65530 too long/);
  });

  test("a file count the bytes cannot hold is rejected before allocating", () => {
    expect(() => decode(cat(varint(1_000_000), [0x00, 0x00]))).toThrow(/data file count 1000000 is larger than the remaining bytes allow/);
  });

  test("a truncated suffix is a FormatError with its offset", () => {
    const read = () => decode(cat([0x01, 0x04, 0x00], "d/"));
    expect(read).toThrow(FormatError);
    expect(read).toThrow(/^mem:\/\/manifest\.ocdbt, offset 3: truncated: data file path suffix needs 4 bytes, 2 left/);
  });
});

describe("data file references", () => {
  const files = ids([
    ["", "d/aa"],
    ["", "d/bb"],
  ]);

  test("an index selects a table entry", () => {
    expect(readDataFileRef(new ByteReader(Uint8Array.from([0x01]), PATH), files, "value file")).toEqual(files[1]);
  });

  test("an index past the table is rejected at its offset", () => {
    const r = new ByteReader(Uint8Array.from([0x00, 0x02]), PATH, 40);
    r.u8("skip");
    expect(() => readDataFileRef(r, files, "value file")).toThrow(/offset 41: value file 2 is past the data file table \(2 entries\)/);
  });
});
