// checkPart after a part is written: what this process wrote and recorded is trusted as it recorded it, so the
// part's record segments are read back only for objects someone else stored.
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { planPhase } from "../../src/convert/convert.js";
import { DEFAULT_EXECUTE, executeObjects } from "../../src/convert/execute.js";
import { checkPart, Shortfall } from "../../src/convert/finalize.js";
import { readPart } from "../../src/convert/ownership.js";
import type { Recorded } from "../../src/convert/records.js";
import { CountingStore } from "../../src/store/counting.js";
import { LocalStore } from "../../src/store/local.js";
import { planOnDisk } from "../helpers/convert.js";
import { FIXTURES } from "../helpers/paths.js";
import { tempDir } from "../helpers/tmp.js";

const TINY = `${FIXTURES}/orbax-axlearn/tiny/step_00000100`;
const OPTIONS = { groups: 1, paramsOnly: false, allowUncommitted: false, force: false, dryRun: false };
const REF = { group: 0, part: 0 };

/** A fresh destination holding the tiny step's part 0, written by this process: its store, source and what it trusts. */
async function written() {
  const root = tempDir("check-part");
  await planPhase(TINY, root, OPTIONS);
  const plan = planOnDisk(join(root, "step_00000100"));
  const destination = new CountingStore(new LocalStore(root), { log: true });
  const part = await readPart(destination, plan, REF);
  const source = new LocalStore(plan.source.root);
  const trusted = new Map<string, Recorded>();
  await executeObjects(part, part.objects, source, destination, { ...DEFAULT_EXECUTE, trusted, part: REF });
  return { part, source, destination, trusted };
}

const recordReads = (store: CountingStore, from: number) => store.reads.slice(from).filter((k) => k.includes("/records/"));

describe("checking a part this process has just written", () => {
  test("reads none of its records back, and finds it done", async () => {
    const { part, source, destination, trusted } = await written();
    expect(trusted.size).toBe(part.objects.length);
    const from = destination.reads.length;
    const shortfall = new Shortfall();
    await checkPart(part, source, destination, trusted, shortfall);
    expect(shortfall.count).toBe(0);
    expect(recordReads(destination, from)).toEqual([]);
  });

  test("a check that trusts nothing of its own (finalize's) reads the records, and finds the same", async () => {
    const { part, source, destination } = await written();
    const from = destination.reads.length;
    const shortfall = new Shortfall();
    await checkPart(part, source, destination, new Map(), shortfall);
    expect(shortfall.count).toBe(0);
    expect(recordReads(destination, from).length).toBeGreaterThan(0);
  });
});
