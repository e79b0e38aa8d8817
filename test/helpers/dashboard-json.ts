// The module's dashboard JSON and log-based metrics (terraform/modules/orbax2reg/dashboard.tf), evaluated by the real
// terraform with no provider: dashboard.tf's and alerts.tf's locals over variables.tf and main.tf, with the trigger's id
// (known only once the function exists) given.
import { copyFileSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parse } from "@cdktf/hcl2json";
import { applyForOutputs, terraform } from "./terraform.js";
import { tempDir } from "./tmp.js";

const MODULE = "terraform/modules/orbax2reg";
export const TRIGGER_ID = "orbax2reg-on-checkpoint-123456";

type Obj = Record<string, unknown>;
const localsOf = (tf: Obj): Obj => Object.assign({}, ...((tf.locals ?? []) as Obj[]));
const moduleFile = async (file: string): Promise<Obj> => (await parse(file, readFileSync(join(MODULE, file), "utf8"))) as Obj;

export interface ModuleDashboard {
  readonly dashboard: Obj;
  readonly logMetrics: Record<string, string>;
  readonly logFilters: Record<string, string>;
}

export async function moduleDashboard(): Promise<ModuleDashboard> {
  const dir = tempDir("dashboard");
  copyFileSync(join(MODULE, "variables.tf"), join(dir, "variables.tf"));
  copyFileSync(join(MODULE, "main.tf"), join(dir, "main.tf"));
  const alerts = localsOf(await moduleFile("alerts.tf"));
  const locals = { ...alerts, ...localsOf(await moduleFile("dashboard.tf")), trigger_id: TRIGGER_ID, trigger_region: "us-central1" };
  const ex = (expression: string): string => `\${${expression}}`;
  writeFileSync(
    join(dir, "probe.tf.json"),
    JSON.stringify({
      locals,
      output: {
        dashboard: { value: ex("local.dashboard") },
        log_metrics: { value: ex("local.log_metrics") },
        log_metric_filters: { value: ex("local.log_metric_filters") },
      },
    }),
  );
  const init = terraform(["init", "-backend=false", "-input=false"], dir);
  if (init.code !== 0) throw new Error(`terraform init: ${init.out}`);
  const vars = ["project_id=my-project", "region=us-central1", "checkpoint_bucket=ckpts", "destination_bucket=regular"];
  const r = applyForOutputs(dir, [...vars.flatMap((v) => ["-var", v]), "-var", "destination_template=gs://regular/{root}"]);
  if (r.code !== 0) throw new Error(`terraform apply: ${r.out}`);
  return {
    dashboard: r.outputs.dashboard as Obj,
    logMetrics: r.outputs.log_metrics as Record<string, string>,
    logFilters: r.outputs.log_metric_filters as Record<string, string>,
  };
}
