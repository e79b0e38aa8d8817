// `terraform fmt -check` without terraform: tools/hclfmt runs hclwrite.Format, the formatter terraform fmt is
// built on, and is installed by scripts/install.sh on every machine (tofu.test.ts adds the real `tofu fmt`
// where OpenTofu was built).
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, expect, test } from "vitest";
import { TOOLS } from "../helpers/paths.js";
import { tempDir } from "../helpers/tmp.js";

const HCLFMT = resolve(TOOLS, "hclfmt");
const hclfmt = (...args: string[]) => {
  const r = spawnSync(HCLFMT, args, { encoding: "utf8" });
  if (r.error) throw new Error(`${HCLFMT}: ${r.error.message} (run scripts/install.sh)`);
  return { code: r.status, out: `${r.stdout}${r.stderr}` };
};

describe("terraform formatting", () => {
  test("every .tf file under terraform/ is in canonical layout", () => {
    expect(hclfmt("-check", "terraform")).toEqual({ code: 0, out: "" });
  });

  test("the check flags a misaligned file", () => {
    const dir = tempDir("hclfmt");
    writeFileSync(join(dir, "main.tf"), 'resource "a" "b" {\n  x = 1\n  longer = 2\n}\n');
    expect(hclfmt("-check", dir)).toEqual({ code: 3, out: `${join(dir, "main.tf")}\n` });
  });

  test("the check rejects invalid HCL", () => {
    const dir = tempDir("hclfmt");
    writeFileSync(join(dir, "main.tf"), 'resource "a" {\n');
    expect(hclfmt("-check", dir).code).toBe(2);
  });
});
