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
 * Shards (by their file sizes, in order) into at most `tasks` contiguous runs, the largest run's bytes as small
 * as can be: each run's first index. Runs, not a greedy largest-first spread: a task's shards are made by one
 * producer in order, so a task decodes again only the prefix of the array its first shard starts inside (a
 * chunk's zstd stream is decoded from its start: stream.ts); spread shards would each start inside an array.
 * The shards are all about --max-shard-size but the last, so runs balance as well as any grouping would.
 */
export function planTaskRuns(sizes: readonly number[], tasks: number): number[] {
  const n = sizes.length;
  const k = Math.max(1, Math.min(Math.floor(tasks), n));
  if (n === 0) return [];
  // The least bound on a run's bytes that k greedy runs meet (binary search over the bound).
  const runsUnder = (bound: number) => {
    let runs = 1;
    let bytes = 0;
    for (const s of sizes) {
      if (bytes + s > bound) {
        runs++;
        bytes = 0;
      }
      bytes += s;
    }
    return runs;
  };
  let lo = Math.max(...sizes);
  let hi = sizes.reduce((a, b) => a + b, 0);
  while (lo < hi) {
    const mid = Math.floor((lo + hi) / 2);
    if (runsUnder(mid) <= k) hi = mid;
    else lo = mid + 1;
  }
  // Cut greedily under the bound, but leave at least one shard for each run still to come: exactly k runs.
  const starts = [0];
  let bytes = 0;
  sizes.forEach((s, i) => {
    if (i === 0) {
      bytes = s;
      return;
    }
    const runsLeft = k - starts.length;
    if (runsLeft > 0 && (bytes + s > lo || n - i === runsLeft)) {
      starts.push(i);
      bytes = 0;
    }
    bytes += s;
  });
  return starts;
}
