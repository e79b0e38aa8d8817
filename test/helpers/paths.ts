import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";

/** Where tests find fixtures and tools (all relative to the repository root, where vitest runs). */
export const FIXTURES = "test/fixtures";
/** Real Orbax checkpoints written by test/fixtures-gen with the real orbax-checkpoint (global setup). */
export const GENERATED = "test/.generated/fixtures";
export const GENERATOR_INPUTS = ["test/fixtures-gen/generate.py", "test/fixtures-gen/bigtree.py", "test/fixtures-gen/requirements.txt"];
export const PYTHON = ".venv/bin/python";
/** test/fixtures-gen/interrupted.py's output: `step_00000200.orbax-checkpoint-tmp`, a save killed before finalize. */
export const INTERRUPTED_ROOT = "test/.generated/interrupted";
/** test/fixtures-gen/many_chunks.py's output: `step_00000100`, 100 arrays of 64 chunks of 2 KiB. */
export const MANY_CHUNKS_ROOT = "test/.generated/many-chunks";
export const TOOLS = ".tools/bin";
/** Google's storage-testbench, installed by scripts/install.sh from ORBAX2REG_STORAGE_TESTBENCH. */
export const TESTBENCH_VENV = ".venv-testbench";
/** AXLearn's own source with what its imports need, installed by scripts/install.sh from ORBAX2REG_AXLEARN. */
export const AXLEARN_PYTHON = ".venv-axlearn/bin/python";
/**
 * test/fixtures-gen/axlearn_orbax.py's output (only where AXLEARN_PYTHON is installed): `checkpoints/step_00000100`,
 * saved by AXLearn's own OrbaxCheckpointer from two processes, each with its tf.data iterator in `tfds/tf_<i>/`.
 */
export const AXLEARN_ORBAX_ROOT = "test/.generated/axlearn-orbax";
/**
 * test/fixtures-gen/axlearn_fuji.py's output (only where AXLEARN_PYTHON is installed): for each variant, a small
 * fuji-shaped LM built from AXLearn's own layers, `<variant>/checkpoints/step_00001000` saved by its
 * OrbaxCheckpointer, with AXLearn's own logits for fixed tokens beside it (expected.json, logits_*.npy).
 */
export const AXLEARN_FUJI_ROOT = "test/.generated/axlearn-fuji";
export const AXLEARN_FUJI_VARIANTS = ["fused-tied", "grouped-untied", "stacked-v1"] as const;
/** torch (CPU), transformers and safetensors, installed by scripts/install.sh: the consumers of an HF export. */
export const HF_PYTHON = ".venv-hf/bin/python";

/** Orbax's own compatibility checkpoints (copied from the orbax repository). */
export const UPSTREAM = `${FIXTURES}/orbax-upstream/composite_checkpoint`;
/** Its variants with metadata the data does not need removed: all must still read and convert. */
export const UPSTREAM_NON_CRITICAL = [
  "missing_commit_timestamp_nsecs_metadata",
  "missing_custom_metadata_metadata",
  "missing_init_timestamp_nsecs_metadata",
  "missing_item_handlers_metadata",
  "missing_metrics_metadata",
  "missing_performance_metrics_metadata",
  "missing_pytree_data_dir_array_metadatas",
  "missing_pytree_data_file__sharding",
].map((v) => `non_critical_metadata_alterations/${v}`);

/** Every file below `dir` (absolute or relative as `dir` is), sorted; none when `dir` does not exist. */
export function filesBelow(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => join(e.parentPath, e.name))
    .sort();
}
