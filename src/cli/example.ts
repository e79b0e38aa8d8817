import { join } from "node:path";
import { UsageError } from "../errors.js";
import { packageRoot } from "../version.js";

/** The example steps the package carries (package.json "files"), by the name `orbax2reg example` takes. */
const EXAMPLES: Readonly<Record<string, string>> = {
  orbax: "test/fixtures/orbax-axlearn/tiny/step_00000100",
  fuji: "test/fixtures/orbax-axlearn/fuji-v2-tiny/step_00001000",
};

/** Where the installed package holds example `name`: found from this module, so any install prefix works. */
export function examplePath(name: string): string {
  const relative = EXAMPLES[name];
  if (relative === undefined) throw new UsageError(`no example "${name}": orbax or fuji`);
  return join(packageRoot(), relative);
}
