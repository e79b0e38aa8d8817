// `orbax2reg cloud check`'s quota stage (src/cloud/ops/check-quota.ts) over the real REST client
// (src/cloud/api/quotas.ts, google-auth-library's PassThroughClient, the project's retry loop). The Cloud Quotas API has
// no emulator, so a small local HTTP server stands in for it (test/helpers/cloud-quotas.ts): it answers
// quotaInfos.list with QuotaInfo resources in the documented JSON shape, two per page, and fails chosen requests.
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { cloudQuotas } from "../../../src/cloud/api/quotas.js";
import { checkQuota, type FanOut, limitIn, memoryMiB, quotaVerdict } from "../../../src/cloud/ops/check-quota.js";
import {
  cpuQuota as cpu,
  memoryQuota as memory,
  type QuotaStandIn,
  quotaInfo as quota,
  startQuotaStandIn,
} from "../../helpers/cloud-quotas.js";

const PROJECT = "my-project";
const REGION = "us-central1";
/** The module's defaults: 8 groups at once, one task each, 8 vCPU / 32 GiB. */
const DEFAULTS: FanOut = { parallelGroups: 8, tasksPerGroup: 1, cpu: 8, memoryMiB: 32 * 1024 };
const unrelated = quota("JobsPerProjectRegion", "run.googleapis.com/job_count", "1", 1000);

let standIn: QuotaStandIn;
beforeAll(async () => {
  standIn = await startQuotaStandIn(PROJECT);
});
afterAll(() => standIn.close());
beforeEach(() => {
  standIn.failures = [];
  standIn.requests.length = 0;
});

const check = async (fanOut: FanOut = DEFAULTS) => checkQuota(await cloudQuotas(standIn.url), PROJECT, REGION, fanOut);

describe("cloud check's quota stage", () => {
  test("the defaults (64 vCPU, 256 GiB) fit a region with 100 vCPU and 400 GiB, read over every page", async () => {
    standIn.infos = [unrelated, cpu(100), unrelated, memory(400)];
    const v = await check();
    expect(v.fits).toBe(true);
    expect(v.detail).toBe(
      "8 groups at once x 1 task x 8 vCPU / 32 GiB = 64 vCPU, 256 GiB; Cloud Run quota in us-central1: " +
        "CPU 100 vCPU (CpuAllocPerProjectRegion), memory 400 GiB (MemAllocPerProjectRegion): fits",
    );
    expect(standIn.requests).toHaveLength(2);
  });

  test("a new project's lower CPU quota does not fit, and the line says how many groups at once would", async () => {
    standIn.infos = [cpu(20), memory(400)];
    const v = await check();
    expect(v.fits).toBe(false);
    expect(v.detail).toMatch(
      /CPU 20 vCPU \(CpuAllocPerProjectRegion\).*does not fit \(CPU 64 vCPU > 20 vCPU\); set max_parallel_groups = 2/,
    );
  });

  test("the region's own value wins over the default for other regions", async () => {
    standIn.infos = [cpu(200, { [REGION]: 32 }), memory(1000)];
    expect((await check()).detail).toMatch(/CPU 32 vCPU .* does not fit .* max_parallel_groups = 4/);
    expect(limitIn(cpu(200, { [REGION]: 32 }), "europe-west1")).toBe(200_000);
  });

  test("the function at its instance bound counts against the same quota, and what is left decides the groups", async () => {
    standIn.infos = [cpu(40), memory(400)];
    const v = await check({ ...DEFAULTS, function: { instances: 10, cpu: 1, memoryMiB: 512 } });
    expect(v.detail).toBe(
      "8 groups at once x 1 task x 8 vCPU / 32 GiB = 64 vCPU, 256 GiB, and the function's 10 instances x 1 vCPU / 0.5 GiB = 10 vCPU, 5 GiB: " +
        "74 vCPU, 261 GiB; Cloud Run quota in us-central1: CPU 40 vCPU (CpuAllocPerProjectRegion), memory 400 GiB (MemAllocPerProjectRegion): " +
        "does not fit (CPU 74 vCPU > 40 vCPU); set max_parallel_groups = 3 (or smaller group_cpu / group_memory), or ask for more quota " +
        "(https://cloud.google.com/run/quotas#increase)",
    );
  });

  test("memory can be the tighter limit", async () => {
    standIn.infos = [cpu(1000), memory(100)];
    const v = await check();
    expect(v.fits).toBe(false);
    expect(v.detail).toMatch(/does not fit \(memory 256 GiB > 100 GiB\); set max_parallel_groups = 3/);
  });

  test("a group too large for the quota on its own says so", async () => {
    standIn.infos = [cpu(4), memory(400)];
    expect((await check()).detail).toMatch(/one group does not fit: use smaller group_cpu \/ group_memory/);
  });

  test("each quota is found by its id, whatever metric name it carries", () => {
    const renamed = quota("MemAllocPerProjectRegion", "run.googleapis.com/memory_allocation_v2", "By", 100 * 2 ** 30);
    expect(quotaVerdict([cpu(1000), renamed], REGION, DEFAULTS).detail).toMatch(/memory 256 GiB > 100 GiB/);
  });

  test("an unlimited value (negative) or no such quota cannot fail the check: it says it cannot tell", () => {
    expect(
      quotaVerdict([quota("CpuAllocPerProjectRegion", "run.googleapis.com/cpu_allocation", "milli-vCPU", -1)], REGION, DEFAULTS),
    ).toMatchObject({
      fits: null,
      detail: expect.stringMatching(/cannot tell whether it fits/),
    });
    expect(quotaVerdict([unrelated], REGION, DEFAULTS).fits).toBeNull();
  });

  test("transient answers (503, 429) are retried, and the answer after them counts", async () => {
    standIn.infos = [cpu(100), memory(400)];
    standIn.failures = [503, 429];
    expect((await check()).fits).toBe(true);
    expect(standIn.requests).toHaveLength(3);
  });

  test("a refusal (403) is not retried and names the permission and the API the caller needs", async () => {
    standIn.failures = [403];
    await expect(check()).rejects.toThrow(
      /cannot read the Cloud Run quotas of project my-project \(.*HTTP 403: Permission 'cloudquotas.quotas.get' denied\): the caller needs cloudquotas.quotas.get .* cloudquotas.googleapis.com enabled/,
    );
    expect(standIn.requests).toHaveLength(1);
  });

  test("terraform's memory quantities, as MiB", () => {
    expect(memoryMiB("32Gi")).toBe(32768);
    expect(memoryMiB("512Mi")).toBe(512);
    expect(memoryMiB("1G")).toBeCloseTo(953.67, 2);
    expect(() => memoryMiB("32GB")).toThrow(/not a memory quantity/);
  });
});
