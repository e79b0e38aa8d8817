// Damaged or incomplete Orbax input: every case fails with one clear line naming the file, a non-zero exit
// code, and no `index` in the destination, so AXLearn never sees a half-converted step as committed.
import { readdirSync, readFileSync, rmSync, statSync, truncateSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { decompress } from "fzstd";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Orbax2RegError } from "../../src/errors.js";
import { listArrays } from "../../src/orbax/arrays.js";
import { openStep } from "../../src/orbax/step.js";
import { runCli } from "../helpers/cli.js";
import { checkRegular, convertWith, copyOf, fileList, fixtureCase, removeScratch, scratch, UPSTREAM } from "../helpers/convert.js";
import { directoryLayoutCopy } from "../helpers/directory-layout.js";
import { zstdFrame } from "../helpers/ocdbt-encode.js";

afterAll(removeScratch);

const tiny = fixtureCase("tiny");
const large = fixtureCase("large");
const MISSING_D = `${UPSTREAM}/critical_metadata_alterations/missing_pytree_data_dir_d`;
const UNMERGED = `${UPSTREAM}/critical_metadata_alterations/missing_pytree_data_file_manifest.ocdbt`;

/** The largest file of a directory (an out-of-line data file of the `large` fixture). */
function largestFile(dir: string): string {
  const files = readdirSync(dir).map((f) => join(dir, f));
  return files.sort((a, b) => statSync(b).size - statSync(a).size)[0] as string;
}

interface Prepared {
  source: string;
  file: string;
  step?: number;
}

interface Damage {
  readonly name: string;
  /** Makes the damaged source; returns it, the file the error must name, and extra CLI arguments. */
  readonly prepare: () => Prepared | Promise<Prepared>;
  readonly reason: RegExp;
}

const DAMAGES: Damage[] = [
  {
    name: "Orbax's fixture with the root d/ directory deleted",
    prepare: () => ({ source: MISSING_D, file: `${MISSING_D}/state/d/`, step: 1 }),
    reason: /no such file/,
  },
  {
    name: "a copy of tiny with one byte of its B+tree node file flipped",
    prepare: () => {
      const step = copyOf(tiny.location, "btree");
      const file = largestFile(join(step, "state/d"));
      const bytes = readFileSync(file);
      bytes[bytes.length >> 1] = (bytes[bytes.length >> 1] as number) ^ 0xff;
      writeFileSync(file, bytes);
      return { source: step, file };
    },
    reason: /CRC-32C mismatch/,
  },
  {
    name: "a copy of large with an out-of-line data file truncated",
    prepare: () => {
      const step = copyOf(large.location, "truncated");
      const file = largestFile(join(step, "state/ocdbt.process_0/d"));
      truncateSync(file, 1000);
      return { source: step, file };
    },
    reason: /short read/,
  },
  {
    name: "a copy of large with an out-of-line data file missing",
    prepare: () => {
      const step = copyOf(large.location, "missing");
      const file = largestFile(join(step, "state/ocdbt.process_0/d"));
      rmSync(file);
      return { source: step, file };
    },
    reason: /no such file/,
  },
  {
    name: "a copy of tiny whose state/_METADATA is not JSON",
    prepare: () => {
      const step = copyOf(tiny.location, "metadata");
      writeFileSync(join(step, "state/_METADATA"), '{"tree_metadata": {');
      return { source: step, file: join(step, "state/_METADATA") };
    },
    reason: /not valid JSON/,
  },
  {
    name: "a copy of tiny whose index/index is not JSON",
    prepare: () => {
      const step = copyOf(tiny.location, "index");
      writeFileSync(join(step, "index/index"), '[["step", 100], ["model');
      return { source: step, file: join(step, "index/index") };
    },
    reason: /not valid JSON/,
  },
  // Passed through, a chunk is not decoded; its zstd frame header, where it declares the decoded size, must
  // agree with the chunk's shape, or TensorStore could not read it.
  {
    name: "a copy of tiny in the directory layout whose prng_key chunk's frame declares 2 GiB decoded",
    prepare: async () => {
      const step = await directoryLayoutCopy(tiny.location, "declared");
      const file = join(step, "state/prng_key/0");
      const elements = decompress(readFileSync(file));
      writeFileSync(file, zstdFrame(elements, { contentSize: 2 ** 31 }));
      return { source: step, file };
    },
    reason:
      /chunk 0 of prng_key: its zstd frame declares 2147483648 bytes decoded, the chunk's shape \[4\] of uint32 holds 16; TensorStore could not read it$/,
  },
  {
    name: "a copy of large whose first chunk's frame declares 4 bytes more than its shape holds (in an OCDBT data file)",
    prepare: async () => {
      const step = copyOf(large.location, "declared-ocdbt");
      for await (const a of listArrays(await openStep(step))) {
        const value = a.chunks.get("0.0")?.value;
        if (a.leaf.path !== "model/decoder/emb/token_emb/weight" || value?.kind !== "file") continue;
        // Level-1 frames of these chunks: magic, descriptor 0x80 (4-byte size), window byte, then the size.
        const file = join(step, value.key);
        const bytes = readFileSync(file);
        const at = value.offset + 6;
        bytes.writeUInt32LE(bytes.readUInt32LE(at) + 4, at);
        writeFileSync(file, bytes);
        return { source: step, file };
      }
      throw new Error("the large fixture has no out-of-line chunk 0.0 of model/decoder/emb/token_emb/weight");
    },
    reason: /chunk 0\.0 of model\/decoder\/emb\/token_emb\/weight: its zstd frame declares 1048580 bytes decoded/,
  },
];

describe.each(DAMAGES)("$name", (damage) => {
  const dest = scratch("damaged-dest");
  let source: string;
  let file: string;
  let step: number | undefined;
  let cli: Awaited<ReturnType<typeof runCli>>;

  beforeAll(async () => {
    ({ source, file, step } = await damage.prepare());
    cli = await runCli(["convert", source, dest, ...(step === undefined ? [] : ["--step", String(step)])]);
  }, 60_000);

  test("the CLI exits with code 2", () => {
    expect(cli.code).toBe(2);
  });

  test("the error is one line that names the damaged file and says what is wrong", () => {
    const lines = cli.stderr.split("\n").filter((l) => l.startsWith("orbax2reg:"));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain(`orbax2reg: ${file}`);
    expect(lines[0]).toMatch(damage.reason);
  });

  test("no index is written (nothing is committed)", () => {
    expect(fileList(dest).filter((f) => /(^|\/)index$/.test(f))).toEqual([]);
  });

  test("the convert() API throws an Orbax2RegError that carries the file", async () => {
    const err = await convertWith(source, scratch("damaged-api"), step === undefined ? {} : { step })
      .then(() => undefined)
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Orbax2RegError);
    expect((err as Orbax2RegError).path).toContain(file);
  });
});

describe("Orbax's fixture whose root manifest.ocdbt is missing (never merged)", () => {
  const dest = scratch("unmerged");

  test("is refused as uncommitted, naming the item and --allow-uncommitted, with no index written", async () => {
    const r = await runCli(["convert", UNMERGED, dest, "--step", "1"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`orbax2reg: ${UNMERGED}/state: the step was never merged`);
    expect(r.stderr).toMatch(/--allow-uncommitted/);
    expect(fileList(dest).filter((f) => /(^|\/)index$/.test(f))).toEqual([]);
  });

  test("converts with --allow-uncommitted from the per-process database, bit-exactly", async () => {
    const r = await runCli(["convert", UNMERGED, dest, "--step", "1", "--allow-uncommitted"]);
    expect(r.code).toBe(0);
    const s = checkRegular([
      {
        name: "unmerged",
        regular: join(dest, "step_00000001"),
        source_item: `${UNMERGED}/state`,
        source_kvstore: `${UNMERGED}/state/ocdbt.process_0`,
        orbax: false,
      },
    ]).get("unmerged");
    expect(s?.problems).toEqual([]);
    expect(s?.arrays_matched).toBe(2);
  });

  test("the converted values are the ones Orbax's generator saved: a = 0..7, b/c = 1..3", () => {
    const values = (path: string) => {
      const raw = decompress(readFileSync(join(dest, "step_00000001/gda", path, "0")));
      return [...new Int32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4)];
    };
    expect(values("a")).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(values("b/c")).toEqual([1, 2, 3]);
  });
});
