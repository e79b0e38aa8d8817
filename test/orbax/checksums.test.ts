import { readFileSync } from "node:fs";
import { describe, expect, test } from "vitest";
import { inspectStep } from "../../src/orbax/inspect.js";
import { openStep } from "../../src/orbax/step.js";
import { newBucket, uploadDir } from "../helpers/gcs.js";
import { FIXTURES, GENERATED } from "../helpers/paths.js";

interface Expected {
  [path: string]: { name: string; dtype: string; shape: number[]; sha256: string };
}

/** Every real Orbax checkpoint we have, with the hashes Python computed when it was written. */
const CHECKPOINTS: [string, string][] = [
  ["shared tiny (AXLearn layout, zarr v2)", `${FIXTURES}/orbax-axlearn/tiny`],
  ["shared dtypes (every dtype, NaN/-0.0/inf)", `${FIXTURES}/orbax-axlearn/dtypes`],
  ["shared zarr3", `${FIXTURES}/orbax-axlearn/zarr3`],
  ["generated dtypes (8-way sharded, rank 0 and 1)", `${GENERATED}/dtypes`],
  ["generated zarr3 (fill-value chunks stored)", `${GENERATED}/zarr3`],
  ["generated zarr3 with absent fill-value chunks", `${GENERATED}/zarr3_nofill`],
  ["generated large (multi-MB out-of-line chunks, subchunked)", `${GENERATED}/large`],
  ["generated two-process save (merged root)", `${GENERATED}/multiprocess`],
  ["generated iterators (python state file)", `${GENERATED}/iterators`],
  ["generated emergency layout", `${GENERATED}/emergency`],
];

async function report(location: string) {
  return inspectStep(await openStep(location), { checksums: true });
}

function expectMatches(arrays: Awaited<ReturnType<typeof report>>["arrays"], expected: Expected) {
  expect(arrays.map((a) => a.path).sort()).toEqual(Object.keys(expected).sort());
  for (const a of arrays) {
    const e = expected[a.path];
    expect({ path: a.path, name: a.name, dtype: a.dtype, shape: a.shape, sha256: a.sha256 }).toEqual({ path: a.path, ...e });
  }
}

describe("inspect --checksums reproduces the hashes Python computed", () => {
  test.each(CHECKPOINTS)("%s", async (_label, dir) => {
    const expected = JSON.parse(readFileSync(`${dir}/expected.json`, "utf8")) as Expected;
    expectMatches((await report(dir)).arrays, expected);
  });

  test("the two-process checkpoint read from fake-gcs-server", async () => {
    const bucket = await newBucket("sums");
    await uploadDir(`${GENERATED}/multiprocess`, bucket, "ckpts");
    const expected = JSON.parse(readFileSync(`${GENERATED}/multiprocess/expected.json`, "utf8")) as Expected;
    expectMatches((await report(`gs://${bucket}/ckpts`)).arrays, expected);
  });
});
