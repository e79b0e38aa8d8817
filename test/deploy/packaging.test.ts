import { spawnSync } from "node:child_process";
import { cpSync, existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { builtinModules } from "node:module";
import { join, resolve } from "node:path";
import { parse } from "@cdktf/hcl2json";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { parse as parseYaml } from "yaml";
import { type ModuleSources, moduleSources } from "../helpers/sources.js";
import { tempDir } from "../helpers/tmp.js";

// What ships: the job image (Dockerfile; no Docker engine runs here, so its structure is checked, and the build context
// terraform gives Cloud Build) and the function's source archive (laid out as terraform zips it, built and loaded).

type Obj = Record<string, unknown>;
const pkg = JSON.parse(readFileSync("package.json", "utf8")) as { dependencies: Record<string, string> };
/** The flags every start of node carries (the launcher's comment says why). */
const NODE_FLAGS = ["--max-semi-space-size=1", "--initial-old-space-size=64"];

function stages(dockerfile: string): string[][] {
  const lines = dockerfile
    .replace(/\\\n/g, " ")
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l !== "" && !l.startsWith("#"));
  const out: string[][] = [];
  for (const l of lines) {
    if (l.startsWith("FROM ")) out.push([]);
    out.at(-1)?.push(l);
  }
  return out;
}

/** Every .js file under `dir`, as paths joined to it. */
const jsFiles = (dir: string): string[] =>
  readdirSync(dir, { recursive: true, encoding: "utf8" })
    .filter((f) => f.endsWith(".js"))
    .map((f) => join(dir, f));

/** The packages the TypeScript sources reachable from `entry` import (relative `.js` specifiers name `.ts` files). */
function importedPackages(entry: string): Set<string> {
  const SPECIFIER = /(?:\bfrom\s*|\bimport\s*\(?\s*)["']([^"'\s]+)["']/g;
  const builtins = new Set(builtinModules.flatMap((m) => [m, `node:${m}`]));
  const seen = new Set<string>();
  const packages = new Set<string>();
  const visit = (file: string) => {
    if (seen.has(file)) return;
    seen.add(file);
    for (const [, spec = ""] of readFileSync(file, "utf8").matchAll(SPECIFIER)) {
      if (builtins.has(spec)) continue;
      if (spec.startsWith(".")) visit(resolve(file, "..", spec.replace(/\.js$/, ".ts")));
      else packages.add(spec.startsWith("@") ? spec.split("/").slice(0, 2).join("/") : (spec.split("/")[0] ?? spec));
    }
  };
  visit(resolve(entry));
  return packages;
}

describe("the job image", () => {
  const dockerfile = readFileSync("Dockerfile", "utf8");
  const [build, runtime] = stages(dockerfile);

  test("builds in one stage and runs from another", () => {
    expect(stages(dockerfile)).toHaveLength(2);
    expect(build?.[0]).toMatch(/^FROM \$\{NODE_IMAGE\} AS build$/);
    expect(runtime?.[0]).toMatch(/^FROM \$\{NODE_IMAGE\}$/);
  });

  test("decodes assets/ that terraform's build context carries in base64 back to the repository's bytes", () => {
    const decode = build?.find((l) => l.startsWith("RUN find assets"))?.slice("RUN ".length);
    expect(decode).toBeDefined();
    const dir = tempDir("assets-b64");
    cpSync("assets", join(dir, "assets"), { recursive: true });
    const model = "assets/tokenizers/bpe_32k_c4.model";
    writeFileSync(join(dir, `${model}.b64`), readFileSync(model).toString("base64"));
    rmSync(join(dir, model));
    const r = spawnSync("sh", ["-c", decode as string], { cwd: dir, encoding: "utf8" });
    expect(r.status, r.stderr).toBe(0);
    expect(readFileSync(join(dir, model)).equals(readFileSync(model))).toBe(true);
    expect(existsSync(join(dir, `${model}.b64`))).toBe(false);
  });

  test("uses Node 22 or later", () => {
    const image = /^ARG NODE_IMAGE=node:(\d+)/m.exec(dockerfile);
    expect(Number(image?.[1])).toBeGreaterThanOrEqual(22);
  });

  test("keeps only production dependencies, compiled code and the data it reads (export-hf's vocabularies)", () => {
    expect(build?.some((l) => /npm prune --omit=dev/.test(l))).toBe(true);
    // Every source of every COPY (its words between the options and the destination).
    const copied = runtime
      ?.filter((l) => l.startsWith("COPY"))
      .flatMap((l) =>
        l
          .split(/\s+/)
          .slice(1, -1)
          .filter((w) => !w.startsWith("--")),
      );
    expect(copied).toEqual(["/app/package.json", "/app/build-info.json", "/app/node_modules", "/app/dist", "/app/bin", "/app/assets"]);
  });

  test("builds the native addon from source against the base image's own Node headers, downloading nothing", () => {
    // Without these, zstd-napi's install fetches a prebuilt binary (github.com) and node-gyp Node's headers (nodejs.org).
    const rebuild = build?.find((l) => /npm rebuild zstd-napi/.test(l));
    expect(rebuild).toMatch(/npm_config_build_from_source=true npm_config_nodedir=\/usr\/local npm rebuild zstd-napi/);
  });

  test("ships only the dependencies the jobs' and the CLI's code import, not the trigger function's", () => {
    const r = spawnSync(process.execPath, ["scripts/image-deps.mjs"], { encoding: "utf8" });
    expect(r.status).toBe(0);
    const kept = r.stdout.trim().split("\n");
    expect(kept).toEqual(expect.arrayContaining(["google-auth-library", "zstd-napi", "fzstd", "@node-rs/crc32"]));
    expect(kept).toEqual(expect.arrayContaining(["commander", "cli-progress", "@google-cloud/run"]));
    for (const other of ["@google-cloud/storage", "@google-cloud/functions-framework"]) expect(kept).not.toContain(other);
    expect(kept.every((p) => p in pkg.dependencies)).toBe(true);
    // The list replaces package.json's dependencies before the prune, which then removes the rest.
    const step = build?.find((l) => /npm prune --omit=dev/.test(l)) ?? "";
    expect(step.indexOf("node scripts/image-deps.mjs --write")).toBeGreaterThan(-1);
    expect(step.indexOf("node scripts/image-deps.mjs --write")).toBeLessThan(step.indexOf("npm prune --omit=dev"));
  });

  test("leaves out source maps and declarations, of the code and of its dependencies", () => {
    const step = build?.find((l) => /npx tsc -p tsconfig.build.json/.test(l)) ?? "";
    expect(step).toMatch(/tsc -p tsconfig.build.json --sourceMap false --declaration false/);
    expect(step).toMatch(/find node_modules -type f .*-name '\*\.map' -o -name '\*\.d\.ts'.* -delete/);
  });

  test("runs as a non-root user", () => {
    const user = runtime?.filter((l) => l.startsWith("USER ")).at(-1);
    expect(user).toBeDefined();
    expect(user).not.toMatch(/^USER (root|0)(:|$)/);
  });

  test("provides the entry point the Cloud Run jobs run", async () => {
    const hcl = await parse("jobs.tf", readFileSync("terraform/modules/orbax2reg/jobs.tf", "utf8"));
    const jobs = Object.values(hcl.resource.google_cloud_run_v2_job) as {
      template: { template: { containers: { command: string[]; args: string[] }[] }[] }[];
    }[][];
    for (const [job] of jobs) {
      const container = job?.template[0]?.template[0]?.containers[0];
      expect(container?.command).toEqual(["node", ...NODE_FLAGS]);
      expect(container?.args[0]).toBe("dist/jobs/main.js");
    }
  });

  test("runs the CLI as its entry point, its help without arguments", () => {
    expect(runtime).toContain(`ENTRYPOINT [${["node", ...NODE_FLAGS, "/app/bin/orbax2reg.js"].map((a) => JSON.stringify(a)).join(", ")}]`);
    expect(runtime).toContain('CMD ["--help"]');
  });

  test("the CLI, the image and the deployed jobs start node with the same runtime settings", () => {
    const shebang = readFileSync("bin/orbax2reg.js", "utf8").split("\n")[0];
    expect(shebang).toBe(`#!/usr/bin/env -S MALLOC_ARENA_MAX=1 node ${NODE_FLAGS.join(" ")}`);
    expect(runtime?.find((l) => l.startsWith("ENTRYPOINT"))).toMatch(
      new RegExp(`^ENTRYPOINT \\[${["node", ...NODE_FLAGS].map((a) => JSON.stringify(a)).join(", ")}, `),
    );
    expect(runtime).toContain("ENV MALLOC_ARENA_MAX=1");
  });

  test("the CLI runs as a command, through its launcher's runtime settings", () => {
    const r = spawnSync("bin/orbax2reg.js", ["--version"], { encoding: "utf8" });
    expect(r.stderr).toBe("");
    expect(r.stdout).toMatch(new RegExp(`^orbax2reg ${JSON.parse(readFileSync("package.json", "utf8")).version} \\(commit `));
  });

  test("every package the compiled code imports is a production dependency", () => {
    const builtins = new Set(builtinModules.flatMap((m) => [m, `node:${m}`]));
    const imported = new Set<string>();
    for (const file of ["dist/src", "dist/jobs", "dist/functions"].flatMap(jsFiles)) {
      for (const m of readFileSync(file, "utf8").matchAll(/(?:from\s+|import\()\s*["']([^"'.][^"']*)["']/g)) {
        const spec = m[1] as string;
        if (builtins.has(spec)) continue;
        imported.add(spec.startsWith("@") ? spec.split("/").slice(0, 2).join("/") : (spec.split("/")[0] as string));
      }
    }
    expect([...imported].filter((p) => !(p in pkg.dependencies))).toEqual([]);
  });

  test("terraform's build context for it is exactly what .dockerignore lets in, and the Dockerfile", () => {
    const allowed = readFileSync(".dockerignore", "utf8")
      .split("\n")
      .filter((l) => l.startsWith("!"))
      .map((l) => l.slice(1));
    expect(readFileSync(".dockerignore", "utf8")).toMatch(/^\*\*$/m);
    const files = (pattern: string): string[] =>
      pattern.endsWith("/**")
        ? readdirSync(pattern.slice(0, -3), { recursive: true, withFileTypes: true })
            .filter((e) => e.isFile())
            .map((e) => join(e.parentPath, e.name))
        : existsSync(pattern)
          ? [pattern]
          : [];
    expect(moduleSources().imageFiles).toEqual(["Dockerfile", ...allowed.flatMap(files)].sort());
  }, 60_000);

  test("every file the Dockerfile copies from the build context is in it", () => {
    const context = new Set(moduleSources().imageFiles.map((f) => f.split("/")[0]));
    for (const l of build ?? []) {
      if (!l.startsWith("COPY ") || l.includes("--from=")) continue;
      // A pattern such as build-info.jso[n] may match nothing: only plain names must be there.
      for (const src of l
        .split(/\s+/)
        .slice(1, -1)
        .filter((s) => !/[[*?]/.test(s)))
        expect(context.has(src.replace(/\/$/, "").split("/")[0] as string), l).toBe(true);
    }
  }, 60_000);

  test("Cloud Build builds it with the module's base image, whose default is the Dockerfile's", async () => {
    const config = readFileSync("terraform/modules/orbax2reg/image-build.cloudbuild.yaml", "utf8");
    const yaml = parseYaml(config) as { steps: { args: string[] }[]; substitutions: Record<string, string> };
    expect(yaml.steps[0]?.args).toEqual([
      "build",
      "--build-arg",
      "NODE_IMAGE=$_NODE_IMAGE",
      "--build-arg",
      "NPM_REGISTRY=$_NPM_REGISTRY",
      "--build-arg",
      "DEBIAN_MIRROR=$_DEBIAN_MIRROR",
      "-t",
      "$_IMAGE",
      ".",
    ]);
    // The mirrors default to empty (the public ones), as the Dockerfile's build arguments do.
    expect(yaml.substitutions).toEqual({ _NPM_REGISTRY: "", _DEBIAN_MIRROR: "" });
    expect(dockerfile).toMatch(/^ARG DEBIAN_MIRROR=$/m);
    expect(dockerfile).toMatch(/^ARG NPM_REGISTRY=$/m);
    expect(config).toContain('images: ["$_IMAGE"]');
    expect(config).toMatch(/^ {2}logging: CLOUD_LOGGING_ONLY$/m);
    const variables = (await parse("variables.tf", readFileSync("terraform/modules/orbax2reg/variables.tf", "utf8"))) as {
      variable: Record<string, { default?: unknown }[]>;
    };
    expect(`ARG NODE_IMAGE=${String(variables.variable.image_build_node_image?.[0]?.default)}`).toBe(
      dockerfile.split("\n").find((l) => l.startsWith("ARG NODE_IMAGE=")),
    );
  });
});

describe("the function's source archive (terraform/modules/orbax2reg/sources.tf)", () => {
  // What terraform zips, evaluated by terraform itself, then laid out and built as Cloud Functions' build does: the
  // buildpack installs the lockfile's dependencies, devDependencies included, runs the `gcp-build` script and prunes
  // the devDependencies (https://cloud.google.com/run/docs/runtimes/nodejs, "NPM build scripts"). Here the install is
  // the function's lockfile's packages copied from the repository's node_modules (the same versions: checked below),
  // and nothing else, so a package the function loads but its lockfile lacks fails the build or the load.
  let sources: ModuleSources;
  let manifest: { main: string; scripts: Record<string, string>; dependencies: Obj; devDependencies: Obj };
  let dir = "";

  beforeAll(() => {
    sources = moduleSources();
    manifest = JSON.parse(sources.functionPackageJson);
    dir = tempDir("function-archive");
    for (const f of sources.functionFiles) cpSync(f, join(dir, f));
    writeFileSync(join(dir, "package.json"), sources.functionPackageJson);
    writeFileSync(join(dir, "package-lock.json"), sources.functionPackageLock);
    const lock = JSON.parse(sources.functionPackageLock) as { packages: Record<string, { optional?: boolean }> };
    for (const [path, entry] of Object.entries(lock.packages)) {
      if (path === "" || (entry.optional && !existsSync(path))) continue;
      cpSync(path, join(dir, path), { recursive: true });
    }
  }, 120_000);
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test("holds the function's TypeScript, the code it imports and the TypeScript configuration (package.json and lockfile are functions/'s)", () => {
    const top = [...new Set(sources.functionFiles.map((f) => f.split("/")[0]))].sort();
    expect(top).toEqual(["functions", "src", "tsconfig.json"]);
    expect(sources.functionFiles).toContain("functions/index.ts");
    expect(sources.functionFiles).toContain("functions/tsconfig.json");
    expect(sources.functionFiles.some((f) => f.startsWith("test/") || f.startsWith("dist/") || f.startsWith("jobs/"))).toBe(false);
    expect(sources.functionPackageJson).toBe(readFileSync("functions/package.json", "utf8"));
    expect(sources.functionPackageLock).toBe(readFileSync("functions/package-lock.json", "utf8"));
  });

  test("its package.json names the function's module, builds it with gcp-build and depends on exactly the packages the function's code imports", () => {
    expect(manifest.main).toBe("dist/functions/index.js");
    // No `prepare` (npm runs it at every install, also after the prune) and no `build` (the buildpack runs it too).
    expect(Object.keys(manifest.scripts)).toEqual(["gcp-build"]);
    expect(manifest.scripts["gcp-build"]).toBe("tsc -p functions/tsconfig.json");
    const repository = JSON.parse(readFileSync("package.json", "utf8"));
    const imported = [...importedPackages("functions/index.ts")].sort();
    expect(imported).not.toContain("zstd-napi");
    expect(Object.keys(manifest.dependencies).sort()).toEqual(imported);
    // The same ranges as the repository's, so one lockfile's versions satisfy both.
    for (const name of imported) expect(manifest.dependencies[name], name).toBe(repository.dependencies[name]);
    expect(manifest.devDependencies).toEqual({
      "@types/node": repository.devDependencies["@types/node"],
      typescript: repository.devDependencies.typescript,
    });
  });

  test("its lockfile is the repository's cut down to the function's packages: same versions, what npm ci checks against the package.json", () => {
    const lock = JSON.parse(sources.functionPackageLock) as {
      packages: Record<string, { version?: string; dependencies?: Obj; devDependencies?: Obj }>;
    };
    const repository = JSON.parse(readFileSync("package-lock.json", "utf8")) as typeof lock;
    expect(lock.packages[""]?.dependencies).toEqual(manifest.dependencies);
    expect(lock.packages[""]?.devDependencies).toEqual(manifest.devDependencies);
    const entries = Object.entries(lock.packages).filter(([k]) => k !== "");
    expect(entries.length).toBeGreaterThan(100);
    for (const [path, entry] of entries) expect(entry.version, path).toBe(repository.packages[path]?.version);
    // No download URLs: npm asks whichever registry is configured (npm_registry's .npmrc) and checks the hashes.
    expect(entries.filter(([, e]) => "resolved" in e).map(([k]) => k)).toEqual([]);
    expect(entries.every(([, e]) => "integrity" in e || (e as { link?: boolean }).link)).toBe(true);
  });

  test("no package the function's build installs runs an install script that downloads anything (no zstd addon)", () => {
    // npm's lockfile marks every package with a preinstall, install or postinstall script (hasInstallScript).
    // protobufjs's postinstall only compares version ranges in the package.json above it (scripts/postinstall.js).
    const lock = JSON.parse(sources.functionPackageLock) as { packages: Record<string, { hasInstallScript?: boolean }> };
    const scripted = Object.entries(lock.packages)
      .filter(([, e]) => e.hasInstallScript)
      .map(([k]) => k);
    expect(scripted).toEqual(["node_modules/protobufjs"]);
    expect(Object.keys(lock.packages).filter((k) => k.includes("zstd"))).toEqual([]);
    const postinstall = readFileSync("node_modules/protobufjs/scripts/postinstall.js", "utf8");
    expect(postinstall).not.toMatch(/require\(["'](https?|child_process|net)["']\)/);
  });

  test("installed from its lockfile alone and built by its gcp-build script, it registers onCheckpointFinalized", () => {
    const [tsc, ...args] = manifest.scripts["gcp-build"]?.split(" ") ?? [];
    expect(tsc).toBe("tsc");
    const build = spawnSync(process.execPath, [join(dir, "node_modules/typescript/bin/tsc"), ...args], { cwd: dir, encoding: "utf8" });
    expect(build.stdout + build.stderr).toBe("");
    expect(build.status).toBe(0);
    expect(readdirSync(join(dir, "dist")).sort()).toEqual(["functions", "src"]);
    // Only what the function imports: none of the OCDBT reader, the zstd codec or the jobs' code.
    expect(existsSync(join(dir, "dist/src/codecs/zstd.js"))).toBe(false);
    expect(existsSync(join(dir, "dist/src/ocdbt"))).toBe(false);
    expect(jsFiles(join(dir, "dist")).some((f) => f.endsWith(".map"))).toBe(false);
    const load = spawnSync(
      process.execPath,
      [
        "--input-type=module",
        "-e",
        `import { getFunction } from "@google-cloud/functions-framework/testing";
         await import(${JSON.stringify(`./${manifest.main}`)});
         console.log(typeof getFunction("onCheckpointFinalized"));`,
      ],
      { cwd: dir, encoding: "utf8" },
    );
    expect(load.stderr).toBe("");
    expect(load.stdout.trim()).toBe("function");
  }, 120_000);

  test("is named by its content: orbax2reg/function-<16 hex digits>.zip", () => {
    expect(sources.functionObject).toMatch(/^orbax2reg\/function-[0-9a-f]{16}\.zip$/);
  });
});
