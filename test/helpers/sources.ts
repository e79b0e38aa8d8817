// What the terraform module builds from (terraform/modules/orbax2reg/sources.tf): the files of the function's and the
// image's source archives, the function's generated package.json and both identities, evaluated by the real terraform
// with no provider (sources.tf holds locals only, over local files).
//
// sources.tf reads the repository at path.module/../../..: the probe module is written three levels below the root it
// is given (<root>/.tf-sources-<unique>/p/m), so the repository itself, or a copy of some of it, is what it reads. Not
// under .cache/: in a git worktree that may be a symbolic link to another checkout, whose files terraform would read.
import { copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { applyForOutputs, terraform } from "./terraform.js";
import { tempDir } from "./tmp.js";

const MODULE = resolve("terraform/modules/orbax2reg");

export interface ModuleSources {
  /** Files of the jobs' image build context, relative to the repository root, sorted. */
  readonly imageFiles: string[];
  /** Files of the function's archive taken from the repository at their paths (not its package.json and lockfile), sorted. */
  readonly functionFiles: string[];
  /** The package.json the function's archive holds instead of the repository's (functions/package.json). */
  readonly functionPackageJson: string;
  /** The lockfile the function's archive holds instead of the repository's (functions/package-lock.json). */
  readonly functionPackageLock: string;
  /** The image's tag: its sources' identity. */
  readonly imageTag: string;
  /** The function's archive's object name: orbax2reg/function-<identity>.zip. */
  readonly functionObject: string;
}

const OUTPUTS: Record<keyof ModuleSources, string> = {
  imageFiles: "local.image_source_files",
  functionFiles: "local.function_source_files",
  functionPackageJson: "local.function_package_json",
  functionPackageLock: "local.function_package_lock",
  imageTag: "local.image_tag",
  functionObject: "local.function_source_object_name",
};

/** Evaluates sources.tf over the repository at `root` (default: this repository) with these module variables. */
export function moduleSources(root = process.cwd(), vars: Record<string, string> = {}): ModuleSources {
  const probe = join(mkdtempSync(join(root, ".tf-sources-")), "p", "m");
  mkdirSync(probe, { recursive: true });
  try {
    copyFileSync(join(MODULE, "variables.tf"), join(probe, "variables.tf"));
    copyFileSync(join(MODULE, "sources.tf"), join(probe, "sources.tf"));
    writeFileSync(
      join(probe, "probe.tf"),
      Object.entries(OUTPUTS)
        .map(([name, expression]) => `output "${name}" {\n  value = ${expression}\n}\n`)
        .join("\n"),
    );
    const init = terraform(["init", "-backend=false", "-input=false", "-no-color"], probe);
    if (init.code !== 0) throw new Error(`terraform init: ${init.out}`);
    const args: string[] = [];
    for (const [k, v] of Object.entries({ project_id: "my-project", region: "us-central1", checkpoint_bucket: "ckpts", ...vars }))
      args.push("-var", `${k}=${v}`);
    const r = applyForOutputs(probe, args);
    if (r.code !== 0) throw new Error(`terraform apply: ${r.out}`);
    return r.outputs as unknown as ModuleSources;
  } finally {
    rmSync(dirname(dirname(probe)), { recursive: true, force: true });
  }
}

/**
 * The repository's files the module reads (its workflow, and what the image's and the function's archives take):
 * one list for every test that copies them (a copy missing one names the archives by other identities).
 */
export const MODULE_REPOSITORY_FILES: readonly string[] = [
  "workflows",
  "Dockerfile",
  "package.json",
  "package-lock.json",
  "tsconfig.json",
  "tsconfig.build.json",
  "scripts/image-deps.mjs",
  "scripts/build-info.mjs",
  "bin",
  "src",
  "jobs",
  "functions",
  "assets",
  // Written by the build (the commit `--version` reports); the image's context takes it where it is.
  ...(existsSync("build-info.json") ? ["build-info.json"] : []),
];

/** A scratch copy of the repository's files both archives read (and a README, which neither does). */
export function copyOfSources(): string {
  const root = tempDir("sources-root");
  for (const entry of [...MODULE_REPOSITORY_FILES, "README.md"]) cpSync(entry, join(root, entry), { recursive: true });
  return root;
}
