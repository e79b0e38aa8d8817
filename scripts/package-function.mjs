#!/usr/bin/env node
// Builds the trigger function's source zip for terraform (`function_source_object`): the compiled function and
// the src/ modules it imports, the repository's package.json (with `main` pointing at the function) and its
// lockfile, so Cloud Build's `npm ci` installs exactly the versions the tests ran with.
//
//   npm run package:function            # writes dist/function-source.zip, prints the object name to upload
//   npm run package:function -- --json  # {"zip": ..., "object": "orbax2reg/function-<sha256 prefix>.zip", ...}
//
// The zip is reproducible (sorted entries, fixed timestamps), so its hash names the code: a new object name is
// exactly a code change, which is what makes terraform redeploy the function.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { createWriteStream, mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { ZipFile } from "yazl";

const ZIP = "dist/function-source.zip";
const FIXED_TIME = new Date("1980-01-01T00:00:00Z");

// A clean build of its own (dist/ may be in use by running tests): nothing compiled from since-deleted
// sources can end up in the zip.
const OUT = ".cache/function-build";
rmSync(OUT, { recursive: true, force: true });
// Not incremental: dist/'s build info would make tsc skip this build, or this one the next build of dist/.
const build = spawnSync("npx", ["tsc", "-p", "tsconfig.build.json", "--outDir", OUT, "--incremental", "false"], { stdio: "inherit" });
if (build.status !== 0) process.exit(build.status ?? 1);

const pkg = JSON.parse(readFileSync("package.json", "utf8"));
const functionPackage = {
  ...pkg,
  main: "dist/functions/index.js",
  // Cloud Build must not run the repository's build scripts: dist/ is already compiled.
  scripts: {},
  // The CLI entry point is not part of the function.
  bin: undefined,
  files: undefined,
};

// Sorted, so the zip is the same byte for byte whenever the code is.
const files = ["src", "functions"]
  .flatMap((dir) => readdirSync(join(OUT, dir), { recursive: true, encoding: "utf8" }).map((f) => `${dir}/${f.split("\\").join("/")}`))
  .filter((f) => f.endsWith(".js"))
  .sort();

const zip = new ZipFile();
const options = { mtime: FIXED_TIME, mode: 0o100644 };
zip.addBuffer(Buffer.from(`${JSON.stringify(functionPackage, null, 2)}\n`), "package.json", options);
zip.addBuffer(readFileSync("package-lock.json"), "package-lock.json", options);
for (const f of files) zip.addBuffer(readFileSync(join(OUT, f)), `dist/${f}`, options);
zip.end();

mkdirSync("dist", { recursive: true });
await new Promise((resolve, reject) => zip.outputStream.pipe(createWriteStream(ZIP)).on("close", resolve).on("error", reject));
const sha256 = createHash("sha256").update(readFileSync(ZIP)).digest("hex");
const result = { zip: ZIP, object: `orbax2reg/function-${sha256.slice(0, 16)}.zip`, sha256, files: files.length + 2 };
if (process.argv.includes("--json")) {
  console.log(JSON.stringify(result));
} else {
  console.log(`${ZIP}: ${result.files} files`);
  console.log(`upload it as ${result.object}:`);
  console.log(`  gcloud storage cp ${ZIP} gs://YOUR_ARTIFACT_BUCKET/${result.object}`);
}
