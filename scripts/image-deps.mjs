#!/usr/bin/env node
// Which production dependencies the image needs: the packages its two entry points' compiled code imports,
// found by following imports from dist/jobs/main.js (what the Cloud Run jobs run) and bin/orbax2reg.js (the
// CLI, the image's ENTRYPOINT): static, `import()` of a literal, `require` of a literal. package.json's
// dependencies also serve the trigger function (functions-framework and its express), which has no business
// in the image: it is deployed from its own zip.
//
//   node scripts/image-deps.mjs [DIST]           # prints the packages, one a line
//   node scripts/image-deps.mjs [DIST] --write   # keeps only those in ./package.json's dependencies
//
// The Dockerfile runs it with --write before `npm prune --omit=dev`, which then removes the rest.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { builtinModules } from "node:module";
import { dirname, join, resolve } from "node:path";

const args = process.argv.slice(2);
const write = args.includes("--write");
const dist = args.find((a) => !a.startsWith("--")) ?? "dist";

const builtins = new Set(builtinModules.flatMap((m) => [m, `node:${m}`]));
// `from "x"` (import and export), `import "x"`, `import("x")`, `require("x")`; a specifier has no white space
// (so prose such as `built from")` in a string is not taken for one).
const SPECIFIER = /(?:\bfrom\s*|\bimport\s*\(?\s*|\brequire\s*\(\s*)["']([^"'\s]+)["']/g;
const packageOf = (spec) => (spec.startsWith("@") ? spec.split("/").slice(0, 2).join("/") : spec.split("/")[0]);

/** The packages the jobs' and the CLI's module graphs import, by name, with one importing file each. */
function importedPackages() {
  const seen = new Set();
  const packages = new Map();
  const visit = (file) => {
    if (seen.has(file)) return;
    seen.add(file);
    if (!existsSync(file)) throw new Error(`${file}: imported, but not in the build`);
    for (const [, spec] of readFileSync(file, "utf8").matchAll(SPECIFIER)) {
      if (builtins.has(spec)) continue;
      if (spec.startsWith(".")) visit(resolve(dirname(file), spec));
      else if (!packages.has(packageOf(spec))) packages.set(packageOf(spec), file);
    }
  };
  visit(resolve(join(dist, "jobs", "main.js")));
  // The launcher lives beside dist/, not in it, and imports the CLI from ../dist/.
  visit(resolve(join(dist, "..", "bin", "orbax2reg.js")));
  return packages;
}

const packages = importedPackages();
const pkg = JSON.parse(readFileSync("package.json", "utf8"));
const missing = [...packages.keys()].filter((p) => !(p in (pkg.dependencies ?? {})));
if (missing.length > 0) {
  console.error(
    `imported by the jobs or the CLI but not production dependencies: ${missing.map((p) => `${p} (${packages.get(p)})`).join(", ")}`,
  );
  process.exit(1);
}
const kept = [...packages.keys()].sort();
if (write) {
  pkg.dependencies = Object.fromEntries(kept.map((p) => [p, pkg.dependencies[p]]));
  writeFileSync("package.json", `${JSON.stringify(pkg, null, 2)}\n`);
}
for (const p of kept) console.log(p);
