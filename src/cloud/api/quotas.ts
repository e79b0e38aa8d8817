import { QuotaApiError } from "../../errors.js";
import { transientStatus } from "../../store/retry.js";
import { type CallRetry, retryCall } from "./grpc.js";

/**
 * The Cloud Quotas API, as `orbax2reg cloud check` reads it: every QuotaInfo of a service for a project
 * (projects.locations.services.quotaInfos.list, `GET https://cloudquotas.googleapis.com/v1/{parent=projects/*\/locations/*\/services/*}/quotaInfos`,
 * location `global`; it needs the permission cloudquotas.quotas.get on the project:
 * https://cloud.google.com/docs/quotas/reference/rest/v1/projects.locations.services.quotaInfos/list).
 * No client library for it is a dependency, so the REST call goes through google-auth-library's client, which
 * signs it with Application Default Credentials.
 */

/** The fields of a QuotaInfo this reads (https://cloud.google.com/docs/quotas/reference/rest/v1/projects.locations.services.quotaInfos). */
export interface QuotaInfo {
  /** projects/P/locations/global/services/S/quotaInfos/ID */
  readonly name?: string;
  /** e.g. CpuAllocPerProjectRegion */
  readonly quotaId?: string;
  /** What it limits, e.g. run.googleapis.com/cpu_allocation. */
  readonly metric?: string;
  /** The unit of the limit's value, e.g. milli-vCPU. */
  readonly metricUnit?: string;
  readonly quotaDisplayName?: string;
  /** The dimensions it is defined on, e.g. ["region"]. */
  readonly dimensions?: readonly string[];
  /**
   * The values in force, from the most specific dimensions to the least: an entry whose `dimensions` lacks a
   * dimension applies to every value of it that no other entry names.
   */
  readonly dimensionsInfos?: readonly {
    readonly dimensions?: Readonly<Record<string, string>>;
    /** int64, so a string in JSON. */
    readonly details?: { readonly value?: string | number };
    readonly applicableLocations?: readonly string[];
  }[];
}

export interface QuotaReader {
  /** Every QuotaInfo of `service` (e.g. run.googleapis.com) for `project`, all pages. */
  list(project: string, service: string): Promise<QuotaInfo[]>;
}

/** Google's endpoint; ORBAX2REG_CLOUDQUOTAS_ENDPOINT (http://host:port) points the reader at a local stand-in. */
export const CLOUD_QUOTAS_ENDPOINT = "https://cloudquotas.googleapis.com";

/** A page (and each REST read of `cloud check`, src/cloud/api/trigger-delivery.ts): four tries, 0.5, 1 and 2 s apart, for what Google's retry strategy calls transient (408, 429, 5xx, a dropped connection). */
export const RETRY: CallRetry = { tries: 4, delayMs: (n) => 500 * 2 ** (n - 1), retryable: (e) => transient(e) };
const TIMEOUT_MS = 15_000;
/** Pages read at most (a runaway page token must not loop forever). */
const MAX_PAGES = 50;

/** What a request through google-auth-library needs: its `request` (an AuthClient, or PassThroughClient for a stand-in). */
export interface RequestClient {
  request<T>(opts: { url: string; method: "GET"; timeout: number; responseType: "json" }): Promise<{ data: T }>;
}

/**
 * A QuotaReader over the REST API. `endpoint` given: a local stand-in, called without credentials; otherwise
 * Google's, with Application Default Credentials (scope cloud-platform, which the method requires).
 */
export async function cloudQuotas(endpoint?: string): Promise<QuotaReader> {
  const { GoogleAuth, PassThroughClient } = await import("google-auth-library");
  const client: RequestClient = endpoint
    ? (new PassThroughClient() as unknown as RequestClient)
    : ((await new GoogleAuth({ scopes: ["https://www.googleapis.com/auth/cloud-platform"] }).getClient()) as unknown as RequestClient);
  return quotaReader(client, (endpoint ?? CLOUD_QUOTAS_ENDPOINT).replace(/\/+$/, ""));
}

export function quotaReader(client: RequestClient, base: string): QuotaReader {
  return {
    async list(project, service) {
      const out: QuotaInfo[] = [];
      let token: string | undefined;
      for (let page = 1; ; page++) {
        const url =
          `${base}/v1/projects/${encodeURIComponent(project)}/locations/global/services/${encodeURIComponent(service)}/quotaInfos` +
          `?pageSize=100${token ? `&pageToken=${encodeURIComponent(token)}` : ""}`;
        const { data } = await retryCall(
          () =>
            client.request<{ quotaInfos?: QuotaInfo[]; nextPageToken?: string }>({
              url,
              method: "GET",
              timeout: TIMEOUT_MS,
              responseType: "json",
            }),
          RETRY,
        ).catch((e) => {
          throw new QuotaApiError(`${url.replace(/\?.*$/, "")}: ${describeFailure(e)}`, statusOf(e));
        });
        out.push(...(data.quotaInfos ?? []));
        token = data.nextPageToken || undefined;
        if (!token) return out;
        if (page >= MAX_PAGES) throw new QuotaApiError(`quotaInfos of ${service}: more than ${MAX_PAGES} pages`, undefined);
      }
    },
  };
}

export const statusOf = (e: unknown): number | undefined => {
  const s = (e as { response?: { status?: unknown }; status?: unknown } | null)?.response?.status ?? (e as { status?: unknown })?.status;
  return typeof s === "number" ? s : undefined;
};

/** Connection failures a retry may get past (Google's retry strategy: "TCP disconnects", timeouts). */
const NETWORK = new Set(["ECONNRESET", "ETIMEDOUT", "ECONNREFUSED", "EPIPE", "EAI_AGAIN", "UND_ERR_SOCKET", "ABORT_ERR"]);

export function transient(e: unknown): boolean {
  const status = statusOf(e);
  if (status !== undefined) return transientStatus(status);
  for (
    let cur = e as { code?: unknown; cause?: unknown } | undefined, depth = 0;
    cur && depth < 5;
    cur = cur.cause as typeof cur, depth++
  ) {
    if (typeof cur.code === "string" && NETWORK.has(cur.code)) return true;
  }
  return (e as { name?: unknown })?.name === "AbortError" || (e as { name?: unknown })?.name === "TimeoutError";
}

export function describeFailure(e: unknown): string {
  const status = statusOf(e);
  const body = (e as { response?: { data?: { error?: { message?: string } } } })?.response?.data?.error?.message;
  if (status !== undefined) return `HTTP ${status}${body ? `: ${body}` : ""}`;
  return (e as Error)?.message ?? String(e);
}
