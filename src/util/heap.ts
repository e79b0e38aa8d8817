// A floor under V8's old-generation limit, for the process entry points (bin/orbax2reg.js, jobs/main.ts).
//
// A conversion's JavaScript heap is small (about 10 MB for the 2 GB fuji step) while it moves gigabytes
// through short-lived socket buffers. V8 sets the next major GC's limit a little above the heap it just
// marked, and with a heap this small the slack stays under the young generation's size, so it starts
// incremental marking again at once: on Node 20, 146 mark-compacts for the 2 GB step gs:// -> gs://, a third
// of the process's CPU (perf). `--initial-old-space-size` would set such a floor, but Node takes it on the
// command line only (not in NODE_OPTIONS); `--heap-growing-percent` is read at every limit computation, so
// after each major GC the growth is set to reach the floor, and handed back to V8's own heuristics (0) once
// the heap is large enough not to need it. A heap that grows past the floor is collected as usual: this
// adds at most the floor's worth of garbage.
import { constants, PerformanceObserver } from "node:perf_hooks";
import { getHeapStatistics, setFlagsFromString } from "node:v8";

/** Below this, the next major GC waits until the heap reaches it. */
export const HEAP_FLOOR = 64 << 20;

/**
 * The `--heap-growing-percent` that makes V8's next limit (the heap times 1 + percent / 100) reach `floor`
 * from `used` bytes; 0 (V8's own growth) once doubling the heap reaches it anyway.
 */
export function growthToFloor(used: number, floor: number): number {
  if (used * 2 >= floor) return 0;
  return Math.min(1000, Math.ceil((100 * (floor - used)) / Math.max(used, 1)));
}

let installed = false;

export function keepHeapFloor(floor = HEAP_FLOOR): void {
  if (installed) return;
  installed = true;
  let percent = -1;
  const adjust = () => {
    const want = growthToFloor(getHeapStatistics().used_heap_size, floor);
    if (want !== percent) {
      percent = want;
      setFlagsFromString(`--heap-growing-percent=${want}`);
    }
  };
  adjust();
  const obs = new PerformanceObserver((list) => {
    if (list.getEntries().some((e) => (e as { detail?: { kind?: number } }).detail?.kind === constants.NODE_PERFORMANCE_GC_MAJOR)) adjust();
  });
  obs.observe({ entryTypes: ["gc"] });
  // The observer must not keep the process alive.
  (obs as unknown as { unref?: () => void }).unref?.();
}
