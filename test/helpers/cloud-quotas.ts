// A local stand-in for the Cloud Quotas API (no emulator of it exists): it answers
// projects.locations.services.quotaInfos.list (GET /v1/projects/P/locations/global/services/S/quotaInfos) with QuotaInfo
// resources in the documented JSON shape
// (https://cloud.google.com/docs/quotas/reference/rest/v1/projects.locations.services.quotaInfos: quotaId, metric,
// metricUnit, dimensions, dimensionsInfos[].dimensions / details.value (int64, a JSON string) / applicableLocations;
// ListQuotaInfosResponse: quotaInfos, nextPageToken), two per page, and can fail chosen requests.
import { createServer } from "node:http";
import type { QuotaInfo } from "../../src/cloud/api/quotas.js";

export interface QuotaStandIn {
  readonly url: string;
  /** What quotaInfos.list returns for run.googleapis.com of the project. */
  infos: QuotaInfo[];
  /** Statuses to answer the next requests with, before answering normally. */
  failures: number[];
  /** Every request's path and query. */
  readonly requests: string[];
  close(): Promise<void>;
}

/** A QuotaInfo as the API lists it: a value for every region, and `perRegion` overrides. */
export function quotaInfo(id: string, metric: string, unit: string, fallback: number, perRegion: Record<string, number> = {}): QuotaInfo {
  return {
    name: `projects/123/locations/global/services/run.googleapis.com/quotaInfos/${id}`,
    quotaId: id,
    metric,
    metricUnit: unit,
    dimensions: ["region"],
    dimensionsInfos: [
      ...Object.entries(perRegion).map(([region, value]) => ({
        dimensions: { region },
        details: { value: String(value) },
        applicableLocations: [region],
      })),
      { details: { value: String(fallback) }, applicableLocations: ["us-central1", "europe-west1", "asia-east1"] },
    ],
  };
}

/** Cloud Run's CPU allocation quota (milli vCPU) of `vcpu`, and its memory allocation quota (bytes) of `gib`. */
export const cpuQuota = (vcpu: number, perRegion: Record<string, number> = {}) =>
  quotaInfo(
    "CpuAllocPerProjectRegion",
    "run.googleapis.com/cpu_allocation",
    "milli-vCPU",
    vcpu * 1000,
    Object.fromEntries(Object.entries(perRegion).map(([r, v]) => [r, v * 1000])),
  );
export const memoryQuota = (gib: number) => quotaInfo("MemAllocPerProjectRegion", "run.googleapis.com/mem_allocation", "By", gib * 2 ** 30);

export async function startQuotaStandIn(project: string, infos: QuotaInfo[] = []): Promise<QuotaStandIn> {
  const state = { infos, failures: [] as number[], requests: [] as string[] };
  const server = createServer((req, res) => {
    state.requests.push(req.url ?? "");
    const status = state.failures.shift();
    if (status !== undefined) {
      res.writeHead(status, { "content-type": "application/json" });
      const message = status === 403 ? "Permission 'cloudquotas.quotas.get' denied" : "unavailable";
      res.end(JSON.stringify({ error: { code: status, message } }));
      return;
    }
    const url = new URL(req.url ?? "", "http://x");
    if (req.method !== "GET" || url.pathname !== `/v1/projects/${project}/locations/global/services/run.googleapis.com/quotaInfos`) {
      res.writeHead(404).end();
      return;
    }
    const start = Number(url.searchParams.get("pageToken") ?? "0");
    const page = state.infos.slice(start, start + 2);
    const next = start + 2 < state.infos.length ? { nextPageToken: String(start + 2) } : {};
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ quotaInfos: page, ...next }));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : 0;
  return Object.assign(state, {
    url: `http://127.0.0.1:${port}`,
    close: () => new Promise<void>((r) => server.close(() => r())),
  });
}
