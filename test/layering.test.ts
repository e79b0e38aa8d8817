import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join, normalize } from "node:path";
import { describe, expect, it } from "vitest";

// The layers, as the folders spell them: the core (src/ outside cli and cloud) knows nothing of the cloud or the
// CLI; src/cloud/api is the Google clients and shared plumbing; the trigger function (src/cloud/trigger) and the job
// runtime (src/cloud/job) are what ship, and never load the operator's commands (src/cloud/ops); the CLI (src/cli)
// sits on top. Checked on the sources' import statements, static and dynamic.

// `from "x"` (import and export), `import "x"`, `import("x")`.
const SPECIFIER = /(?:\bfrom\s*|\bimport\s*\(?\s*)["'](\.{1,2}\/[^"']+)["']/g;

/** Every .ts file under `dir`, repository-relative with forward slashes. */
const sources = (dir: string): string[] =>
  readdirSync(dir, { recursive: true, encoding: "utf8" })
    .filter((f) => f.endsWith(".ts"))
    .map((f) => join(dir, f).split("\\").join("/"));

/** The repository files `file` imports by relative path (`.js` specifiers name the `.ts` source). */
function imports(file: string): string[] {
  return [...readFileSync(file, "utf8").matchAll(SPECIFIER)].map(([, spec = ""]) =>
    normalize(join(dirname(file), spec.replace(/\.js$/, ".ts")))
      .split("\\")
      .join("/"),
  );
}

/** Every file reachable from `entry` through relative imports. */
function graph(entry: string): Set<string> {
  const seen = new Set<string>();
  const visit = (f: string) => {
    if (seen.has(f) || !existsSync(f)) return;
    seen.add(f);
    for (const g of imports(f)) visit(g);
  };
  visit(entry);
  return seen;
}

/** `from -> to` for every import from a file under one of `from` to a file under one of `to`. */
function edges(from: readonly string[], to: readonly string[]): string[] {
  const under = (f: string, dirs: readonly string[]) => dirs.some((d) => f.startsWith(`${d}/`));
  return from
    .flatMap(sources)
    .flatMap((f) => imports(f).map((g) => [f, g] as const))
    .filter(([, g]) => under(g, to))
    .map(([f, g]) => `${f} -> ${g}`);
}

const CORE = readdirSync("src", { withFileTypes: true })
  .filter((d) => d.isDirectory() && d.name !== "cli" && d.name !== "cloud")
  .map((d) => `src/${d.name}`);

describe("layering", () => {
  it("the core imports neither the cloud layer nor the CLI", () => {
    expect(CORE.length).toBeGreaterThan(5);
    const top = readdirSync("src")
      .filter((f) => f.endsWith(".ts"))
      .flatMap((f) => imports(`src/${f}`).map((g) => `src/${f} -> ${g}`))
      .filter((e) => / -> src\/(cloud|cli)\//.test(e));
    expect([...edges(CORE, ["src/cloud", "src/cli"]), ...top]).toEqual([]);
  });

  it("the cloud layer never imports the CLI", () => {
    expect(edges(["src/cloud"], ["src/cli"])).toEqual([]);
  });

  it("the API clients import no trigger, job or operator code", () => {
    expect(edges(["src/cloud/api"], ["src/cloud/trigger", "src/cloud/job", "src/cloud/ops"])).toEqual([]);
  });

  it("the trigger and the job runtime never import the operator commands", () => {
    expect(edges(["src/cloud/trigger", "src/cloud/job"], ["src/cloud/ops"])).toEqual([]);
  });

  it("the job image loads no trigger, operator or CLI code", () => {
    const loaded = [...graph("jobs/main.ts")];
    expect(loaded).toContain("src/cloud/job/run.ts");
    expect(loaded.filter((f) => /^src\/(cloud\/(trigger|ops)|cli)\//.test(f))).toEqual([]);
  });

  it("the trigger function loads no job, operator or CLI code", () => {
    const loaded = [...graph("functions/index.ts")];
    expect(loaded).toContain("src/cloud/trigger/handler.ts");
    expect(loaded.filter((f) => /^src\/(cloud\/(job|ops)|cli)\//.test(f))).toEqual([]);
  });

  it("the trigger function loads neither the OCDBT reader nor the zstd codec (its build installs no zstd addon)", () => {
    const loaded = [...graph("functions/index.ts")];
    expect(loaded).toContain("src/orbax/step-name.ts");
    expect(loaded.filter((f) => /^src\/(ocdbt|zarr|convert\/(?!work-dir)|codecs\/zstd)/.test(f) || f === "src/orbax/step.ts")).toEqual([]);
  });
});
