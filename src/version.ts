import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/**
 * Which orbax2reg this is: the package's version (package.json, its one source) and the source commit it was
 * built from (build-info.json beside package.json, written at build and pack time by scripts/build-info.mjs:
 * an installed package or image has no .git to ask). `orbax2reg --version` prints it, `convert --json` and the
 * plans it writes record it, so a result can be traced to the code that made it.
 */
export interface BuildIdentity {
  readonly version: string;
  /** The full commit id, or "unknown" (built without git and without ORBAX2REG_COMMIT). */
  readonly commit: string;
  /** Whether tracked files differed from that commit; null when not known. */
  readonly dirty: boolean | null;
}

let cached: BuildIdentity | undefined;

/** The package's root: the first folder up from this module holding a package.json (the same from src/ and dist/src/). */
export function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "package.json"))) {
    const up = dirname(dir);
    if (up === dir) throw new Error(`no package.json above ${fileURLToPath(import.meta.url)}`);
    dir = up;
  }
  return dir;
}

function readJson(file: string): Record<string, unknown> | undefined {
  try {
    return JSON.parse(readFileSync(file, "utf8")) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

export function buildIdentity(): BuildIdentity {
  if (cached !== undefined) return cached;
  const root = packageRoot();
  const pkg = readJson(join(root, "package.json"));
  const info = readJson(join(root, "build-info.json"));
  const commit = typeof info?.commit === "string" && info.commit !== "" ? info.commit : "unknown";
  cached = {
    version: typeof pkg?.version === "string" ? pkg.version : "unknown",
    commit,
    dirty: commit !== "unknown" && typeof info?.dirty === "boolean" ? info.dirty : null,
  };
  return cached;
}

/** One line, e.g. `orbax2reg 0.2.0 (commit 0123abcd4567, clean)`; `(commit unknown)` when built without git. */
export function versionLine(id: BuildIdentity = buildIdentity()): string {
  if (id.commit === "unknown") return `orbax2reg ${id.version} (commit unknown)`;
  const state = id.dirty === null ? "" : id.dirty ? ", dirty" : ", clean";
  return `orbax2reg ${id.version} (commit ${id.commit.slice(0, 12)}${state})`;
}
