import { readFileSync } from "node:fs";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { FormatError, NotFoundError } from "../../src/errors.js";
import { OcdbtDatabase } from "../../src/ocdbt/database.js";
import { decodeEnvelope } from "../../src/ocdbt/envelope.js";
import { decodeManifest, latestVersion, type Manifest } from "../../src/ocdbt/manifest.js";
import { LocalStore } from "../../src/store/local.js";
import { config, envelope, leafBody, MISSING, manifestBody, type Version } from "../helpers/ocdbt-encode.js";
import { FIXTURES } from "../helpers/paths.js";

const NG = `${FIXTURES}/ocdbt-neuroglancer`;
const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");
const te = new TextEncoder();

const MANIFEST_PATH = `${NG}/files_high_arity.ocdbt/manifest.ocdbt`;
const decode = (bytes: Uint8Array, path = "mem://manifest.ocdbt"): Manifest =>
  decodeManifest(decodeEnvelope(bytes, "manifest", path, 1 << 20));
const version = (generation: number, offset = 0): Version => ({ generation, file: 0, offset, length: 50 });

async function tempStore(): Promise<LocalStore> {
  return new LocalStore(await mkdtemp(join(tmpdir(), "orbax2reg-manifest-")));
}

async function keys(db: OcdbtDatabase): Promise<string[]> {
  const out: string[] = [];
  for await (const e of db.list()) out.push(e.key);
  return out;
}

/** Writes d/leaf<generation> with one inline key, and returns the version pointing at it. */
async function writeLeaf(store: LocalStore, generation: number, key: string): Promise<Version> {
  const node = envelope("btreeNode", leafBody([], [{ key, value: te.encode(key) }]));
  await store.write(`d/leaf${generation}`, node);
  return { generation, file: 0, offset: 0, length: node.length, numKeys: 1, numTreeBytes: node.length };
}

describe("manifest", () => {
  test("the doc §9 worked manifest decodes field by field", () => {
    const m = decode(new Uint8Array(readFileSync(MANIFEST_PATH)), MANIFEST_PATH);
    expect(m.kind).toBe("versions");
    if (m.kind !== "versions") return;
    expect(hex(m.config.uuid)).toBe("c297fed98f4286d54957e7d4738210c1");
    expect(m.config).toMatchObject({
      manifestKind: "single",
      maxInlineValueBytes: 100,
      maxDecodedNodeBytes: 8388608,
      versionTreeArityLog2: 4,
      compression: { method: "zstd", level: 0 },
    });
    expect(m.inlineVersions).toEqual([
      {
        generation: 1,
        rootHeight: 0,
        root: { file: { basePath: "", relativePath: "d/9b07a9a00a1a562b1c801f1d164a90c6" }, offset: 0, length: 89 },
        stats: { numKeys: 8, numTreeBytes: 89, numIndirectValueBytes: 0 },
        commitTimeNs: 0x181f95e1d3edf37cn,
      },
    ]);
    expect(m.versionNodes).toEqual([]);
  });

  test("the test encoder reproduces the §9 manifest body byte for byte", () => {
    // Cross-checks the encoder the other tests rely on against the real file.
    const real = decodeEnvelope(new Uint8Array(readFileSync(MANIFEST_PATH)), "manifest", MANIFEST_PATH, 1 << 20);
    const body = manifestBody(
      { uuid: Buffer.from("c297fed98f4286d54957e7d4738210c1", "hex") },
      [["", "d/9b07a9a00a1a562b1c801f1d164a90c6"]],
      [{ generation: 1, file: 0, offset: 0, length: 89, numKeys: 8, numTreeBytes: 89, commitTimeNs: 0x181f95e1d3edf37cn }],
    );
    expect(hex(body)).toBe(hex(real.take(real.remaining, "body")));
  });

  test("a manifest of kind numbered holds only the config", () => {
    const m = decode(envelope("manifest", config({ kind: 1 })));
    expect(m.kind).toBe("config-only");
    expect(m.config.manifestKind).toBe("numbered");
  });

  test("a config-only manifest with trailing bytes is rejected", () => {
    const bytes = envelope("manifest", new Uint8Array([...config({ kind: 1 }), 0x00]));
    expect(() => decode(bytes)).toThrow(/unexpected trailing bytes after config-only manifest/);
  });

  test("manifest_kind 2 is rejected", () => {
    expect(() => decode(envelope("manifest", config({ kind: 2 })))).toThrow(/manifest_kind 2/);
  });

  test("an uncompressed config (compression_method 0) has no zstd level", () => {
    const m = decode(envelope("manifest", config({ kind: 1, zstdLevel: null })));
    expect(m.config.compression).toEqual({ method: "none" });
  });

  test("the latest version is the last inline version", () => {
    const m = decode(envelope("manifest", manifestBody({}, [["", "d/x"]], [version(1, 100), version(2, 200), version(3, 300)])));
    if (m.kind !== "versions") throw new Error("expected versions");
    expect(latestVersion(m)?.generation).toBe(3);
    expect(latestVersion(m)?.root?.offset).toBe(300);
  });

  test("generation numbers that do not increase are rejected", () => {
    const bytes = envelope("manifest", manifestBody({}, [["", "d/x"]], [version(2), version(2)]));
    expect(() => decode(bytes)).toThrow(/generation numbers not increasing/);
  });

  test("an empty-tree version (offset = length = 2^64-1) has no root, and its database lists no keys", async () => {
    const store = await tempStore();
    const empty: Version = { generation: 1, file: 0, offset: MISSING, length: MISSING };
    await store.write("manifest.ocdbt", envelope("manifest", manifestBody({}, [["", ""]], [empty])));
    const db = await OcdbtDatabase.open(store);
    expect(db.version?.root).toBeNull();
    expect(await keys(db)).toEqual([]);
    expect(await db.get("a")).toBeUndefined();
  });

  test("an empty-tree version with statistics is rejected", () => {
    const bad: Version = { generation: 1, file: 0, offset: MISSING, length: MISSING, numKeys: 1 };
    const bytes = envelope("manifest", manifestBody({}, [["", ""]], [bad]));
    expect(() => decode(bytes)).toThrow(/empty tree with non-zero height or statistics/);
  });
});

describe("numbered manifests", () => {
  test("the database opens the manifest.<16 hex> file with the highest number", async () => {
    const store = await tempStore();
    await store.write("manifest.ocdbt", envelope("manifest", config({ kind: 1 })));
    for (const [g, key] of [
      [1, "old"],
      [2, "middle"],
      [16, "new"],
    ] as const) {
      const v = await writeLeaf(store, g, key);
      const name = `manifest.${g.toString(16).padStart(16, "0")}`;
      await store.write(name, envelope("manifest", manifestBody({}, [["", `d/leaf${g}`]], [v])));
    }
    const db = await OcdbtDatabase.open(store);
    expect(db.manifestKey).toBe("manifest.0000000000000010");
    expect(db.version?.generation).toBe(16);
    expect(await keys(db)).toEqual(["new"]);
  });

  test("names that are not exactly 16 lowercase hex digits are ignored", async () => {
    const store = await tempStore();
    await store.write("manifest.ocdbt", envelope("manifest", config({ kind: 1 })));
    const v = await writeLeaf(store, 1, "k");
    await store.write("manifest.0000000000000001", envelope("manifest", manifestBody({}, [["", "d/leaf1"]], [v])));
    for (const junk of ["manifest.00000000000000FF", "manifest.000000000000000ff", "manifest.0000000000000002.tmp"]) {
      await store.write(junk, new Uint8Array([1, 2, 3]));
    }
    const db = await OcdbtDatabase.open(store);
    expect(db.manifestKey).toBe("manifest.0000000000000001");
  });

  test("a generation that differs from the file name is a FormatError naming the file", async () => {
    const store = await tempStore();
    await store.write("manifest.ocdbt", envelope("manifest", config({ kind: 1 })));
    const v = await writeLeaf(store, 2, "k");
    await store.write("manifest.0000000000000003", envelope("manifest", manifestBody({}, [["", "d/leaf2"]], [v])));
    const e = await OcdbtDatabase.open(store).catch((err: unknown) => err);
    expect(e).toBeInstanceOf(FormatError);
    expect((e as FormatError).path).toBe(join(store.root, "manifest.0000000000000003"));
    expect((e as FormatError).message).toMatch(/latest generation 2 does not match the file name/);
  });

  test("no numbered manifest file is a NotFoundError", async () => {
    const store = await tempStore();
    await store.write("manifest.ocdbt", envelope("manifest", config({ kind: 1 })));
    await expect(OcdbtDatabase.open(store)).rejects.toThrow(NotFoundError);
  });

  test("a database under a sub-directory finds its numbered manifests there", async () => {
    const store = await tempStore();
    await store.write("db/manifest.ocdbt", envelope("manifest", config({ kind: 1 })));
    const node = envelope("btreeNode", leafBody([], [{ key: "k", value: te.encode("v") }]));
    await store.write("db/d/leaf", node);
    const v: Version = { generation: 5, file: 0, offset: 0, length: node.length };
    await store.write("db/manifest.0000000000000005", envelope("manifest", manifestBody({}, [["", "d/leaf"]], [v])));
    const db = await OcdbtDatabase.open(store, "db");
    expect(db.manifestKey).toBe("db/manifest.0000000000000005");
    const entry = await db.get("k");
    expect(entry && new TextDecoder().decode(await db.readValue(entry.value))).toBe("v");
  });
});
