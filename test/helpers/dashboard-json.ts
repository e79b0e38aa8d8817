// The module's dashboard JSON, log-based metrics and alert policies (terraform/modules/orbax2reg/dashboard.tf,
// monitoring.tf, alerts.tf), evaluated by the real terraform with no provider: those files' locals over variables.tf
// and main.tf, with the trigger's id (known only once the function exists) given. These are the values the resources
// hand to Google.
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

/** A log-based metric of monitoring.tf's table, as written there (optional fields absent). */
export interface LogMetric {
  readonly on: string;
  readonly component: string;
  readonly value_type: "INT64" | "DISTRIBUTION";
  readonly unit: string;
  readonly messages: readonly string[];
  readonly value_extractor?: string;
  readonly exponential_buckets?: { num_finite_buckets: number; growth_factor: number; scale: number };
}

/** An alert policy of alerts.tf's table, with the filter its condition resolves to. */
export interface AlertPolicy {
  readonly title: string;
  readonly condition: string;
  readonly documentation: string;
  readonly threshold?: { series: string; above: number; aligner: string; period: string; filter: string };
  readonly log_match?: string;
}

export interface ModuleDashboard {
  readonly dashboard: Obj;
  /** Log-based metric names by key. */
  readonly logMetrics: Record<string, string>;
  /** Their Logging queries by key. */
  readonly logFilters: Record<string, string>;
  readonly logMetricTable: Record<string, LogMetric>;
  readonly alertPolicies: Record<string, AlertPolicy>;
}

/** `vars`: more -var settings, e.g. hf_export={...} (the export's metrics, charts and alert exist only with it). */
export async function moduleDashboard(vars: readonly string[] = []): Promise<ModuleDashboard> {
  const dir = tempDir("dashboard");
  copyFileSync(join(MODULE, "variables.tf"), join(dir, "variables.tf"));
  copyFileSync(join(MODULE, "main.tf"), join(dir, "main.tf"));
  const files = await Promise.all(["alerts.tf", "monitoring.tf", "dashboard.tf"].map(moduleFile));
  const locals = { ...Object.assign({}, ...files.map(localsOf)), trigger_id: TRIGGER_ID, trigger_region: "us-central1" };
  const ex = (expression: string): string => `\${${expression}}`;
  writeFileSync(
    join(dir, "probe.tf.json"),
    JSON.stringify({
      locals,
      output: {
        dashboard: { value: ex("local.dashboard") },
        log_metric_names: { value: ex("local.log_metric_names") },
        log_metric_filters: { value: ex("local.log_metric_filters") },
        log_metrics: { value: ex("local.log_metrics") },
        // The threshold's filter as google_monitoring_alert_policy.pipeline resolves it.
        alert_policies: {
          value: ex(
            "{ for k, p in local.alert_policies : k => merge(p, can(p.threshold) ? { threshold = merge(p.threshold, { filter = local.series_filters[p.threshold.series] }) } : {}) }",
          ),
        },
      },
    }),
  );
  const init = terraform(["init", "-backend=false", "-input=false"], dir);
  if (init.code !== 0) throw new Error(`terraform init: ${init.out}`);
  const given = ["project_id=my-project", "region=us-central1", "checkpoint_bucket=ckpts", "destination_bucket=regular", ...vars];
  const r = applyForOutputs(dir, [...given.flatMap((v) => ["-var", v]), "-var", "destination_template=gs://regular/{root}"]);
  if (r.code !== 0) throw new Error(`terraform apply: ${r.out}`);
  return {
    dashboard: r.outputs.dashboard as Obj,
    logMetrics: r.outputs.log_metric_names as Record<string, string>,
    logFilters: r.outputs.log_metric_filters as Record<string, string>,
    logMetricTable: r.outputs.log_metrics as Record<string, LogMetric>,
    alertPolicies: r.outputs.alert_policies as Record<string, AlertPolicy>,
  };
}
