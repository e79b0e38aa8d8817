/** Where tests find fixtures and tools (all relative to the repository root, where vitest runs). */
export const FIXTURES = "test/fixtures";
/** Real Orbax checkpoints written by test/fixtures-gen with the real orbax-checkpoint (global setup). */
export const GENERATED = "test/.generated/fixtures";
export const GENERATOR_INPUTS = ["test/fixtures-gen/generate.py", "test/fixtures-gen/bigtree.py", "test/fixtures-gen/requirements.txt"];
export const PYTHON = ".venv/bin/python";
export const TOOLS = ".tools/bin";
