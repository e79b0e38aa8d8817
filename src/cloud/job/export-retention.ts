import { INDEX_NAME } from "../../hf/shards.js";
import { parseStepName } from "../../orbax/step.js";
import { openStore } from "../../store/open.js";
import { joinKey, type Store } from "../../store/store.js";
import { type Env, integer } from "../api/env.js";
import type { Logger } from "../api/log.js";
import { isKeepAll, type RetentionPolicy, stepsToPrune } from "./retention.js";

/**
 * Retention of the pipeline's Hugging Face exports, apart from the regular checkpoints' (terraform: the export's
 * keep_last_n / keep_every_n_steps): after export-finalize commits a step's export, older exports beside it are
 * deleted by the same rule (stepsToPrune, AXLearn's). Exports beside it: the other step_XXXXXXXX folders in the
 * export's parent folder (the export template ends in {step}) that hold an index. Without a step-named export
 * folder there is nothing to compare, and nothing is deleted.
 */

/** ORBAX2REG_EXPORT_KEEP_LAST_N and ORBAX2REG_EXPORT_KEEP_EVERY_N_STEPS (unset, empty or 0: that rule off). */
export function exportRetentionFromEnv(env: Env): RetentionPolicy {
  const rule = (name: string) => {
    const v = integer(env, name, { min: 0, max: 99_999_999, fallback: 0 });
    return v === 0 ? null : v;
  };
  return { keepLastN: rule("ORBAX2REG_EXPORT_KEEP_LAST_N"), keepEveryNSteps: rule("ORBAX2REG_EXPORT_KEEP_EVERY_N_STEPS") };
}

/**
 * Deletes the committed exports beside `exportUrl` the policy drops (never `justWritten`'s); their index first,
 * so that a deletion cut short leaves an uncommitted folder, never a complete-looking partial one. Never throws:
 * a failure is logged at ERROR and the next export's finalize tries again. Returns the steps deleted.
 */
export async function pruneExports(
  policy: RetentionPolicy,
  exportUrl: string,
  justWritten: number,
  log: Logger,
  open: (url: string) => Promise<Store> = openStore,
): Promise<number[]> {
  if (isKeepAll(policy)) return [];
  const trimmed = exportUrl.replace(/\/+$/, "");
  const slash = trimmed.lastIndexOf("/");
  const own = trimmed.slice(slash + 1);
  if (parseStepName(own) === undefined) {
    log.warn("export retention skipped: the export folder is not named step_XXXXXXXX", { export: exportUrl });
    return [];
  }
  const rlog = log.with({ exportRetention: { ...policy } });
  const pruned: number[] = [];
  try {
    const parent = await open(trimmed.slice(0, slash));
    const committed = new Map<number, string>();
    for (const dir of (await parent.listDir("")).dirs) {
      const step = parseStepName(dir);
      if (step !== undefined && (await parent.stat(joinKey(dir, INDEX_NAME))) !== undefined) committed.set(step, dir);
    }
    for (const step of stepsToPrune([...committed.keys()], policy, justWritten)) {
      const dir = committed.get(step) as string;
      await parent.delete(joinKey(dir, INDEX_NAME));
      for await (const o of parent.list(`${dir}/`)) await parent.delete(o.key);
      pruned.push(step);
    }
    rlog.info("export retention applied", { step: justWritten, pruned });
  } catch (e) {
    rlog.error(
      `export pruning failed; the export of step ${justWritten} is committed and the next export retries: ${(e as Error).message}`,
      {
        pruned,
      },
    );
  }
  return pruned;
}
