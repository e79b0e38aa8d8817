import { QuotaApiError } from "../../errors.js";
import type { QuotaInfo, QuotaReader } from "../api/quotas.js";

/**
 * Whether the configured fan-out fits the region's Cloud Run quota, before the first real step. A conversion runs
 * min(groups, max_parallel_groups) convert-group job executions at once, each of tasks_per_group tasks of group_cpu
 * vCPU and group_memory (8 x 1 x 8 vCPU / 32 GiB = 64 vCPU, 256 GiB at the module's defaults). Cloud Run limits the
 * CPU and memory allocated at once in a region, per project: the quotas whose metrics are
 * run.googleapis.com/cpu_allocation (milli vCPU) and run.googleapis.com/mem_allocation (bytes), quota ids
 * CpuAllocPerProjectRegion and MemAllocPerProjectRegion (https://cloud.google.com/run/quotas; read through the Cloud
 * Quotas API, src/cloud/api/quotas.ts). A new project's values can be lower than the defaults need.
 *
 * The trigger function is a Cloud Run service in the same region: at its instance bound it counts against the same
 * quota, and is added to the demand. What the API gives is the limit in force, not what else already uses it: any
 * other Cloud Run workload in the region counts against it too.
 */
export interface FanOut {
  /** Job executions of convert-group at once: min(groups, max_parallel_groups). */
  readonly parallelGroups: number;
  readonly tasksPerGroup: number;
  /** vCPU of one task. */
  readonly cpu: number;
  /** Memory of one task, MiB. */
  readonly memoryMiB: number;
  /**
   * The trigger function at its instance bound (function_max_instances x function_cpu / function_memory): a Cloud Run
   * service too, in the same region, so on the same quota while a conversion's events wake it.
   */
  readonly function?: { readonly instances: number; readonly cpu: number; readonly memoryMiB: number };
}

export interface QuotaVerdict {
  readonly fits: boolean | null;
  /** One line for the check's report. */
  readonly detail: string;
}

// The quotas by id, or by metric should an id ever change: quotaInfos as the Cloud Quotas API lists them for
// run.googleapis.com (services/run.googleapis.com/quotaInfos/CpuAllocPerProjectRegion, metric
// run.googleapis.com/cpu_allocation, unit milli-vCPU; .../MemAllocPerProjectRegion, run.googleapis.com/mem_allocation,
// unit By). The ids are the ones Cloud Run's "Quota violated: MemAllocPerProjectRegion requested: ..." errors name.
const CPU_QUOTA = { id: "CpuAllocPerProjectRegion", metric: "run.googleapis.com/cpu_allocation" } as const;
const MEMORY_QUOTA = { id: "MemAllocPerProjectRegion", metric: "run.googleapis.com/mem_allocation" } as const;

/** "8Gi", "512Mi", "32G", "4096M" as MiB (Kubernetes quantities, as Cloud Run takes them). */
export function memoryMiB(quantity: string): number {
  const m = /^(\d+(?:\.\d+)?)(Mi|Gi|M|G)$/.exec(quantity.trim());
  if (!m) throw new Error(`not a memory quantity (512Mi, 32Gi): ${JSON.stringify(quantity)}`);
  const n = Number(m[1]);
  return { Mi: n, Gi: n * 1024, M: (n * 1e6) / 2 ** 20, G: (n * 1e9) / 2 ** 20 }[m[2] as "Mi" | "Gi" | "M" | "G"];
}

/**
 * The limit of `info` in `region`: the entry that names the region (or lists it among its applicable locations),
 * else the one that names no region (it covers every region no other entry names). null: unlimited (a negative
 * value) or not stated.
 */
export function limitIn(info: QuotaInfo, region: string): number | null {
  const entries = info.dimensionsInfos ?? [];
  const entry =
    entries.find((d) => d.dimensions?.region === region) ??
    entries.find((d) => d.dimensions?.region === undefined && (d.applicableLocations ?? []).includes(region)) ??
    entries.find((d) => d.dimensions?.region === undefined);
  const raw = entry?.details?.value;
  if (raw === undefined) return null;
  const value = Number(raw);
  return Number.isFinite(value) && value >= 0 ? value : null;
}

/** The limit converted to vCPU or MiB, from the quota's own unit. */
function inUnits(info: QuotaInfo, value: number, kind: "cpu" | "memory"): number | undefined {
  const unit = (info.metricUnit ?? "").toLowerCase();
  if (kind === "cpu") {
    if (unit === "" || unit.includes("milli")) return value / 1000; // milli vCPU, the documented unit
    if (unit.includes("cpu") || unit === "1") return value;
    return undefined;
  }
  if (unit === "" || unit === "by" || unit === "bytes" || unit === "byte" || unit === "1") return value / 2 ** 20;
  if (unit === "mib" || unit === "miby") return value;
  if (unit === "gib" || unit === "giby") return value * 1024;
  return undefined;
}

const gib = (mib: number) => `${Number((mib / 1024).toFixed(1))} GiB`;

/**
 * Reads the quotas and says whether `fanOut` fits in `region`. Who runs the check needs cloudquotas.quotas.get on the
 * project (https://cloud.google.com/docs/quotas/reference/rest/v1/projects.locations.services.quotaInfos/list). The
 * narrowest predefined role holding it is Cloud Quotas Viewer, roles/cloudquotas.viewer
 * (https://cloud.google.com/iam/docs/roles-permissions/cloudquotas); the project needs cloudquotas.googleapis.com
 * enabled (terraform apis.tf does).
 */
export async function checkQuota(reader: QuotaReader, project: string, region: string, fanOut: FanOut): Promise<QuotaVerdict> {
  let infos: QuotaInfo[];
  try {
    infos = await reader.list(project, "run.googleapis.com");
  } catch (e) {
    if (e instanceof QuotaApiError && (e.status === 401 || e.status === 403)) {
      throw new Error(
        `cannot read the Cloud Run quotas of project ${project} (${e.message}): the caller needs cloudquotas.quotas.get ` +
          "(e.g. Cloud Quotas Viewer, roles/cloudquotas.viewer) and the project cloudquotas.googleapis.com enabled",
      );
    }
    throw e;
  }
  return quotaVerdict(infos, region, fanOut);
}

export function quotaVerdict(infos: readonly QuotaInfo[], region: string, fanOut: FanOut): QuotaVerdict {
  const tasks = fanOut.parallelGroups * fanOut.tasksPerGroup;
  const fn = fanOut.function ?? { instances: 0, cpu: 0, memoryMiB: 0 };
  const fnCpu = fn.instances * fn.cpu;
  const fnMiB = fn.instances * fn.memoryMiB;
  const needCpu = tasks * fanOut.cpu + fnCpu;
  const needMiB = tasks * fanOut.memoryMiB + fnMiB;
  const groups =
    `${fanOut.parallelGroups} group${fanOut.parallelGroups === 1 ? "" : "s"} at once x ${fanOut.tasksPerGroup} task x ` +
    `${fanOut.cpu} vCPU / ${gib(fanOut.memoryMiB)} = ${tasks * fanOut.cpu} vCPU, ${gib(tasks * fanOut.memoryMiB)}`;
  const need =
    fn.instances === 0
      ? groups
      : `${groups}, and the function's ${fn.instances} instances x ${fn.cpu} vCPU / ${gib(fn.memoryMiB)} = ${fnCpu} vCPU, ` +
        `${gib(fnMiB)}: ${needCpu} vCPU, ${gib(needMiB)}`;
  const limits: {
    what: string;
    id: string;
    have: number;
    needed: number;
    perTask: number;
    reserved: number;
    show: (v: number) => string;
  }[] = [];
  const unread: string[] = [];
  for (const [kind, quota] of [
    ["cpu", CPU_QUOTA],
    ["memory", MEMORY_QUOTA],
  ] as const) {
    for (const info of infos.filter((i) => i.quotaId === quota.id || i.metric === quota.metric)) {
      const raw = limitIn(info, region);
      if (raw === null) continue; // unlimited here
      const have = inUnits(info, raw, kind);
      const id = info.quotaId ?? info.name ?? quota.metric;
      if (have === undefined) {
        unread.push(`${id} (unit ${JSON.stringify(info.metricUnit)})`);
        continue;
      }
      limits.push(
        kind === "cpu"
          ? { what: "CPU", id, have, needed: needCpu, perTask: fanOut.cpu, reserved: fnCpu, show: (v) => `${Number(v.toFixed(2))} vCPU` }
          : { what: "memory", id, have, needed: needMiB, perTask: fanOut.memoryMiB, reserved: fnMiB, show: gib },
      );
    }
  }
  if (limits.length === 0) {
    const why =
      unread.length > 0
        ? `quotas in an unknown unit: ${unread.join(", ")}`
        : `no ${CPU_QUOTA.metric} or ${MEMORY_QUOTA.metric} limit listed for ${region}`;
    return { fits: null, detail: `${need}; cannot tell whether it fits (${why}): see https://cloud.google.com/run/quotas` };
  }
  const stated = limits.map((l) => `${l.what} ${l.show(l.have)} (${l.id})`).join(", ");
  const short = limits.filter((l) => l.needed > l.have);
  if (short.length === 0) return { fits: true, detail: `${need}; Cloud Run quota in ${region}: ${stated}: fits` };
  // How many groups at once would fit: the tightest limit, whole tasks per group.
  const groupsThatFit = Math.min(...limits.map((l) => Math.floor((l.have - l.reserved) / (l.perTask * fanOut.tasksPerGroup))));
  const advice =
    groupsThatFit >= 1
      ? `set max_parallel_groups = ${groupsThatFit} (or smaller group_cpu / group_memory), or ask for more quota`
      : "one group does not fit: use smaller group_cpu / group_memory, or ask for more quota";
  return {
    fits: false,
    detail: `${need}; Cloud Run quota in ${region}: ${stated}: does not fit (${short.map((l) => `${l.what} ${l.show(l.needed)} > ${l.show(l.have)}`).join(", ")}); ${advice} (https://cloud.google.com/run/quotas#increase)`,
  };
}
