import { InvalidArgumentError } from "commander";

/**
 * Sizes as `transformers` reads --max-shard-size (utils/hub.py convert_file_size_to_int): decimal KB/MB/GB
 * (5GB = 5 * 10^9 bytes), binary KiB/MiB/GiB, or a number of bytes.
 */
const UNITS: Readonly<Record<string, number>> = {
  "": 1,
  b: 1,
  bytes: 1,
  kb: 1e3,
  mb: 1e6,
  gb: 1e9,
  tb: 1e12,
  kib: 2 ** 10,
  mib: 2 ** 20,
  gib: 2 ** 30,
  tib: 2 ** 40,
};

/** Bytes of a size like `5GB`, `512MiB`, `1000000`; `bare` is the unit of a bare number. */
export function parseSize(text: string, bare = 1): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(text);
  const unit = m?.[2]?.toLowerCase() ?? "";
  const scale = unit === "" ? bare : UNITS[unit];
  if (m === null || scale === undefined) throw new InvalidArgumentError("must be a size such as 5GB, 500MB, 2GiB or a number of bytes");
  const n = Math.floor(Number(m[1]) * scale);
  if (!Number.isSafeInteger(n) || n < 1) throw new InvalidArgumentError("must be a positive size");
  return n;
}

/** `--max-shard-size`: a number alone is bytes. */
export const shardSize = (text: string): number => parseSize(text, 1);
/** `--memory` of export-hf: a number alone is MiB, as convert's --memory. */
export const memorySize = (text: string): number => parseSize(text, 2 ** 20);

export const DEFAULT_MAX_SHARD_SIZE = 5e9;

/**
 * Tensors (by their sizes, in order) into shards as huggingface_hub's split_state_dict_into_shards_factory
 * does: a tensor joins the current shard unless that would take it over `max`, then it starts the next; a
 * tensor larger than `max` gets a shard of its own. Unlike the hub's, that shard keeps its place (the hub
 * appends it before the shard being filled): every shard is a run of consecutive tensors, which the export
 * makes in order. Returns each shard's tensor indices.
 */
export function planShards(sizes: readonly number[], max: number): number[][] {
  const shards: number[][] = [];
  let current: number[] = [];
  let bytes = 0;
  sizes.forEach((size, i) => {
    if (size > max) {
      if (current.length > 0) shards.push(current);
      shards.push([i]);
      current = [];
      bytes = 0;
      return;
    }
    if (bytes + size > max && current.length > 0) {
      shards.push(current);
      current = [];
      bytes = 0;
    }
    current.push(i);
    bytes += size;
  });
  if (current.length > 0) shards.push(current);
  return shards;
}

/** `model-00001-of-00003.safetensors`, as transformers names shards (SAFE_WEIGHTS_NAME, 5 digits). */
export function shardName(i: number, count: number): string {
  const pad = (n: number) => String(n).padStart(5, "0");
  return `model-${pad(i + 1)}-of-${pad(count)}.safetensors`;
}

export const INDEX_NAME = "model.safetensors.index.json";

/** The index as transformers writes it: json.dumps(index, indent=2, sort_keys=True) + "\n". */
export function indexText(totalSize: number, weightMap: ReadonlyMap<string, string>): string {
  const sorted = [...weightMap].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const map = sorted.map(([k, v]) => `    ${JSON.stringify(k)}: ${JSON.stringify(v)}`).join(",\n");
  return `{\n  "metadata": {\n    "total_size": ${totalSize}\n  },\n  "weight_map": {\n${map}\n  }\n}\n`;
}

/**
 * Shards (by their file sizes, in order) into at most `tasks` contiguous runs: each run's first index. A run's
 * work is its shards' bytes plus `prefix[first]`: what a task starting at that shard decodes again to reach it
 * (the earlier layers of the stacked array the shard starts inside: a chunk's zstd stream is decoded from its
 * start, stream.ts). The largest run's work is as small as can be; among the cuts that achieve it, the fewest
 * runs (each task costs its start), then the least decoded again. Runs, not a greedy largest-first spread: a
 * task's shards are made by one producer in order, so a task decodes again only the prefix of the one array its
 * first shard starts inside; spread shards would each start inside an array.
 */
export function planTaskRuns(sizes: readonly number[], tasks: number, prefix: readonly number[] = []): number[] {
  const n = sizes.length;
  if (n === 0) return [];
  const k = Math.max(1, Math.min(Math.floor(tasks), n));
  const before = (i: number) => (i === 0 ? 0 : (prefix[i] ?? 0));
  const total = sizes.reduce((a, b) => a + b, 0);
  // best[b]: the fewest runs covering shards [0, b) with no run's work over `bound`, then the least prefix.
  const cover = (bound: number) => {
    const best: { runs: number; extra: number; from: number }[] = [{ runs: 0, extra: 0, from: -1 }];
    for (let b = 1; b <= n; b++) {
      let pick = { runs: Number.POSITIVE_INFINITY, extra: 0, from: -1 };
      let bytes = 0;
      for (let a = b - 1; a >= 0; a--) {
        bytes += sizes[a] as number;
        if (bytes > bound) break;
        const p = best[a] as { runs: number; extra: number };
        if (bytes + before(a) > bound || !Number.isFinite(p.runs)) continue;
        const c = { runs: p.runs + 1, extra: p.extra + before(a), from: a };
        if (c.runs < pick.runs || (c.runs === pick.runs && c.extra < pick.extra)) pick = c;
      }
      best.push(pick);
    }
    return best;
  };
  let lo = Math.max(...sizes);
  let hi = total + Math.max(0, ...prefix);
  while (lo < hi) {
    const mid = Math.floor((lo + hi) / 2);
    if ((cover(mid)[n] as { runs: number }).runs <= k) hi = mid;
    else lo = mid + 1;
  }
  const best = cover(lo);
  const starts: number[] = [];
  for (let b = n; b > 0; b = (best[b] as { from: number }).from) starts.unshift((best[b] as { from: number }).from);
  return starts;
}
