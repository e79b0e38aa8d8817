// Step directory names (step_%08d, Orbax's temporary names): pure string functions, apart from step.ts so that the
// trigger function, which only tells commit markers by name, loads none of the OCDBT reader (nor its zstd addon).

const STEP_DIR = /^step_(\d+)$/;
/** In the name of a directory Orbax is still writing (or abandoned): never a committed step. */
export const TMP_MARK = ".orbax-checkpoint-tmp";

/** Whether `step` is a step AXLearn's regular format can name (its directory takes 8 digits). */
export function isStepNumber(step: number | undefined): step is number {
  return step !== undefined && Number.isSafeInteger(step) && step >= 0 && step < 1e8;
}

/** `step_%08d`: the step directory name AXLearn writes, for Orbax and regular checkpoints alike. */
export function stepDirName(step: number): string {
  return `step_${String(step).padStart(8, "0")}`;
}

export function parseStepName(name: string): number | undefined {
  const m = STEP_DIR.exec(name);
  return m ? Number(m[1]) : undefined;
}

/**
 * The step of a step directory still under Orbax's temporary name: `step_00000200.orbax-checkpoint-tmp`
 * (orbax >= 0.11.20), or with `-<counter>` / `-<timestamp>` (older): docs in /orbax-format.md §1.3.
 */
export function parseTemporaryStepName(name: string): number | undefined {
  const m = /^step_(\d+)\.orbax-checkpoint-tmp(?:-\d+)?$/.exec(name);
  return m ? Number(m[1]) : undefined;
}
