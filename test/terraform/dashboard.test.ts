// The module's Cloud Monitoring dashboard (terraform/modules/orbax2reg/dashboard.tf), evaluated by the real terraform
// with no provider (the module's variables.tf and main.tf, and the locals of alerts.tf and dashboard.tf, with the two
// values only Google knows before the apply, the trigger's id and region, given), then checked:
// - against the Dashboards API's messages (test/helpers/dashboard-schema.ts, from google/monitoring/dashboard/v1/*.proto);
// - every metric it charts is one of Google's built-in metrics listed below (with the page that lists it) or a
//   log-based metric the module creates, with the monitored resource it is written on;
// - every aligner and reducer suits its metric's kind and value type (common.proto's Aligner and Reducer), and every
//   grouping and legend names a label the metric or its resource has.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parse } from "@cdktf/hcl2json";
import { beforeAll, describe, expect, test } from "vitest";
import { type LogMetric, moduleDashboard, TRIGGER_ID } from "../helpers/dashboard-json.js";
import { schemaErrors, seconds } from "../helpers/dashboard-schema.js";

const MODULE = "terraform/modules/orbax2reg";

type Obj = Record<string, unknown>;
type MetricKind = "DELTA" | "GAUGE" | "CUMULATIVE";
type ValueType = "INT64" | "DOUBLE" | "DISTRIBUTION";
interface Metric {
  readonly kind: MetricKind;
  readonly valueType: ValueType;
  readonly resource: string;
  readonly labels: readonly string[];
  readonly resourceLabels: readonly string[];
}

/**
 * Google's built-in metrics the dashboard charts, as https://cloud.google.com/monitoring/api/metrics_gcp_p_z lists them
 * (sections "pubsub", "run", "storage", "workflows"), with their monitored resources' labels
 * (https://cloud.google.com/monitoring/api/resources).
 */
const BUILT_IN: Readonly<Record<string, Metric>> = {
  "workflows.googleapis.com/finished_execution_count": {
    kind: "DELTA",
    valueType: "INT64",
    resource: "workflows.googleapis.com/Workflow",
    labels: ["status", "revision_id"],
    resourceLabels: ["resource_container", "location", "workflow_id"],
  },
  "storage.googleapis.com/network/received_bytes_count": {
    kind: "DELTA",
    valueType: "INT64",
    resource: "gcs_bucket",
    labels: ["response_code", "method"],
    resourceLabels: ["project_id", "bucket_name", "location"],
  },
  "run.googleapis.com/request_count": {
    kind: "DELTA",
    valueType: "INT64",
    resource: "cloud_run_revision",
    labels: ["response_code", "response_code_class"],
    resourceLabels: ["project_id", "service_name", "revision_name", "location", "configuration_name"],
  },
  "run.googleapis.com/job/completed_task_attempt_count": {
    kind: "DELTA",
    valueType: "INT64",
    resource: "cloud_run_job",
    labels: ["result"],
    resourceLabels: ["project_id", "job_name", "location"],
  },
  "pubsub.googleapis.com/subscription/oldest_unacked_message_age": {
    kind: "GAUGE",
    valueType: "INT64",
    resource: "pubsub_subscription",
    labels: [],
    resourceLabels: ["project_id", "subscription_id"],
  },
  "pubsub.googleapis.com/subscription/num_undelivered_messages": {
    kind: "GAUGE",
    valueType: "INT64",
    resource: "pubsub_subscription",
    labels: [],
    resourceLabels: ["project_id", "subscription_id"],
  },
};

/** Which metrics each aligner and reducer takes (common.proto's comments on Aggregation.Aligner and .Reducer). */
const ALIGNER_FITS: Readonly<Record<string, (m: Metric) => boolean>> = {
  ALIGN_DELTA: (m) => m.kind === "DELTA" || m.kind === "CUMULATIVE",
  ALIGN_SUM: (m) => m.kind === "DELTA" || m.kind === "GAUGE",
  ALIGN_MAX: (m) => (m.kind === "DELTA" || m.kind === "GAUGE") && m.valueType !== "DISTRIBUTION",
};
const REDUCER_FITS: Readonly<Record<string, (aligned: ValueType) => boolean>> = {
  REDUCE_SUM: () => true,
  REDUCE_MAX: (v) => v !== "DISTRIBUTION",
  REDUCE_PERCENTILE_50: () => true,
  REDUCE_PERCENTILE_95: () => true,
};

let dashboard: Obj;
let logMetrics: Record<string, string>;
let logFilters: Record<string, string>;
let logMetricTable: Record<string, LogMetric>;
const moduleFile = async (file: string): Promise<Obj> => (await parse(file, readFileSync(join(MODULE, file), "utf8"))) as Obj;
/** A terraform expression as a JSON-syntax string. */
const ex = (expression: string): string => `\${${expression}}`;

/** hf_export on: every chart and metric the module can have is checked (the export's exist only with it). */
const HF_EXPORT = 'hf_export={every_n_steps = 5000, destination_template = "gs://regular/{root}/hf/{step}"}';

beforeAll(async () => {
  ({ dashboard, logMetrics, logFilters, logMetricTable } = await moduleDashboard([HF_EXPORT]));
}, 120_000);

/** Every chart's data sets, with the chart's title. */
function dataSets(): { chart: string; set: Obj }[] {
  const tiles = (dashboard.mosaicLayout as { tiles: { widget: { title: string; xyChart?: { dataSets: Obj[] } } }[] }).tiles;
  return tiles.flatMap((t) => (t.widget.xyChart?.dataSets ?? []).map((set) => ({ chart: t.widget.title, set })));
}
const filterOf = (set: Obj) => ((set.timeSeriesQuery as Obj).timeSeriesFilter as { filter: string; aggregation: Obj }).filter;
const aggregationOf = (set: Obj) => ((set.timeSeriesQuery as Obj).timeSeriesFilter as { aggregation: Obj }).aggregation;

/** The log-based metrics the module creates (monitoring.tf's table), by metric type, with their descriptors. */
function moduleLogMetrics(): Record<string, Metric> {
  const onResource = (key: string) => (/resource\.type="([^"]+)"/.exec(logFilters[key] ?? "")?.[1] ?? "?") as string;
  return Object.fromEntries(
    Object.entries(logMetricTable).map(([key, m]): [string, Metric] => [
      `logging.googleapis.com/user/${logMetrics[key]}`,
      // Every log-based metric of the module is a DELTA (dashboard.tf's metric_descriptor).
      { kind: "DELTA", valueType: m.value_type, resource: onResource(key), labels: ["log"], resourceLabels: [] },
    ]),
  );
}

describe("the dashboard's JSON", () => {
  test("is a Dashboard of the Dashboards API: only its fields, the right types and enum values, oneofs and required fields", () => {
    expect(schemaErrors(dashboard)).toEqual([]);
    expect(dashboard.displayName).toBe("orbax2reg: checkpoint conversions");
  });

  test("the schema check refuses what the API would: an unknown field, an enum value not in the proto, two members of a oneof", () => {
    const tile = (widget: Obj) => ({
      displayName: "d",
      mosaicLayout: { columns: 12, tiles: [{ xPos: 0, yPos: 0, width: 6, height: 4, widget }] },
    });
    const filter = {
      timeSeriesFilter: { filter: 'metric.type="x"', aggregation: { alignmentPeriod: "60s", perSeriesAligner: "ALIGN_SUMS" } },
    };
    const badAligner = schemaErrors(tile({ xyChart: { dataSets: [{ timeSeriesQuery: filter }] } }));
    expect(badAligner).toHaveLength(1);
    expect(badAligner[0]).toMatch(/aggregation\.perSeriesAligner: "ALIGN_SUMS" is not one of ALIGN_NONE, /);
    expect(schemaErrors(tile({ text: { content: "x" }, xyChart: { dataSets: [] } }))).toEqual([
      expect.stringMatching(/widget: at most one of xyChart, scorecard, text, blank \(oneof\)/),
    ]);
    expect(schemaErrors(tile({ text: { content: "x", colour: "red" } }))).toEqual([
      "$.mosaicLayout.tiles[0].widget.text.colour: not a field of Text",
    ]);
    expect(schemaErrors({ mosaicLayout: { columns: 12, tiles: [] } })).toEqual(["$: Dashboard.displayName is required"]);
  });

  test("the mosaic's tiles fit its 1 to 12 columns and do not overlap (layouts.proto)", () => {
    const { columns, tiles } = dashboard.mosaicLayout as {
      columns: number;
      tiles: { xPos?: number; yPos?: number; width: number; height: number }[];
    };
    expect(columns).toBeGreaterThanOrEqual(1);
    expect(columns).toBeLessThanOrEqual(12);
    const taken = new Set<string>();
    // A position left out is 0 (proto3), as the API answers it.
    for (const { xPos = 0, yPos = 0, ...size } of tiles) {
      const t = { xPos, yPos, ...size };
      expect(t.xPos).toBeGreaterThanOrEqual(0);
      expect(t.yPos).toBeGreaterThanOrEqual(0);
      expect(t.width).toBeGreaterThanOrEqual(1);
      expect(t.height).toBeGreaterThanOrEqual(1);
      expect(t.xPos + t.width).toBeLessThanOrEqual(columns);
      for (let x = t.xPos; x < t.xPos + t.width; x++)
        for (let y = t.yPos; y < t.yPos + t.height; y++) {
          expect(taken.has(`${x},${y}`), `block ${x},${y}`).toBe(false);
          taken.add(`${x},${y}`);
        }
    }
  });

  test("no tile names a position of 0: the API leaves zero-valued fields out, so it would show as a change at every plan", () => {
    const tiles = (dashboard.mosaicLayout as { tiles: Record<string, unknown>[] }).tiles;
    expect(tiles.some((t) => t.xPos === undefined && t.yPos === undefined)).toBe(true);
    for (const t of tiles) {
      expect(t.xPos, JSON.stringify(t)).not.toBe(0);
      expect(t.yPos, JSON.stringify(t)).not.toBe(0);
    }
  });

  test("without hf_export: no export metric, chart or alert (there is no export job)", async () => {
    const off = await moduleDashboard();
    expect(Object.keys(off.logMetrics).sort()).toEqual(["conversion_seconds", "conversions_started", "trigger_starts"]);
    const titles = (off.dashboard.mosaicLayout as { tiles: { widget: { title: string } }[] }).tiles.map((t) => t.widget.title);
    expect(titles.filter((t) => /export/i.test(t))).toEqual([]);
    expect(Object.keys(off.alertPolicies)).not.toContain("export_failed");
  }, 120_000);

  test("with hf_export: exports committed, and each export-shards task's speed from its mbPerSecond", () => {
    const titles = (dashboard.mosaicLayout as { tiles: { widget: { title: string } }[] }).tiles.map((t) => t.widget.title);
    expect(titles).toContain("Hugging Face exports committed");
    expect(titles).toContain("Hugging Face export: shard-writing speed per task (MB/s)");
    expect(logMetricTable.export_task_mb_per_second).toMatchObject({
      value_extractor: "EXTRACT(jsonPayload.mbPerSecond)",
      value_type: "DISTRIBUTION",
      exponential_buckets: { num_finite_buckets: 20, growth_factor: 2, scale: 0.1 },
    });
  });

  test("charts what the issue asks for: conversions, duration, bytes, events, the trigger's backlog, task attempts", () => {
    const titles = (dashboard.mosaicLayout as { tiles: { widget: { title: string } }[] }).tiles.map((t) => t.widget.title);
    for (const words of [
      /^Conversions: started/,
      /^Conversion duration/,
      /^Bytes written to gs:\/\/regular$/,
      /^Checkpoint events/,
      /^Trigger backlog: age/,
      /^Trigger backlog: unacknowledged/,
      /^Job task attempts by result/,
    ])
      expect(
        titles.some((t) => words.test(t)),
        String(words),
      ).toBe(true);
  });

  test("an XyChart's thresholds have neither color nor direction (metrics.proto: not allowed in a XyChart)", () => {
    const tiles = (dashboard.mosaicLayout as { tiles: { widget: { xyChart?: { thresholds?: Obj[] } } }[] }).tiles;
    const thresholds = tiles.flatMap((t) => t.widget.xyChart?.thresholds ?? []);
    expect(thresholds).toEqual([{ label: "backlog alert", value: 600 }]);
  });

  test("every aggregation aligns over at least 60 s, and reduces only what it aligned (common.proto)", () => {
    for (const { chart, set } of dataSets()) {
      const a = aggregationOf(set) as { alignmentPeriod: string; perSeriesAligner: string; crossSeriesReducer?: string };
      expect(seconds(a.alignmentPeriod), chart).toBeGreaterThanOrEqual(60);
      expect(seconds(a.alignmentPeriod), chart).toBeLessThanOrEqual(104 * 7 * 86_400);
      if (a.crossSeriesReducer && a.crossSeriesReducer !== "REDUCE_NONE") expect(a.perSeriesAligner, chart).not.toBe("ALIGN_NONE");
    }
  });
});

describe("every charted metric", () => {
  test("exists: one of Google's built-in metrics, or a log-based metric the module creates, on the resource it is written on", () => {
    const known = { ...BUILT_IN, ...moduleLogMetrics() };
    const charted = new Set<string>();
    for (const { chart, set } of dataSets()) {
      const filter = filterOf(set);
      const type = /metric\.type="([^"]+)"/.exec(filter)?.[1] as string;
      const metric = known[type];
      expect(metric, `${chart}: ${type}`).toBeDefined();
      expect(filter, chart).toContain(`resource.type="${metric?.resource}"`);
      charted.add(type);
    }
    // Each log-based metric the module creates is charted; each built-in one listed above is too.
    expect([...charted].sort()).toEqual(Object.keys(known).sort());
  });

  test("is aligned and reduced as its kind and value type allow, grouped and named by labels it has", () => {
    const known = { ...BUILT_IN, ...moduleLogMetrics() };
    for (const { chart, set } of dataSets()) {
      const metric = known[/metric\.type="([^"]+)"/.exec(filterOf(set))?.[1] as string] as Metric;
      const a = aggregationOf(set) as { perSeriesAligner: string; crossSeriesReducer: string; groupByFields?: string[] };
      expect(ALIGNER_FITS[a.perSeriesAligner]?.(metric), `${chart}: ${a.perSeriesAligner} on ${metric.kind} ${metric.valueType}`).toBe(
        true,
      );
      expect(REDUCER_FITS[a.crossSeriesReducer]?.(metric.valueType), `${chart}: ${a.crossSeriesReducer}`).toBe(true);
      const labels = [...metric.labels.map((l) => `metric.labels.${l}`), ...metric.resourceLabels.map((l) => `resource.labels.${l}`)];
      for (const g of a.groupByFields ?? []) expect(labels, `${chart}: group by ${g}`).toContain(g);
      // A legend interpolates only what the reduction kept.
      for (const [, name] of String(set.legendTemplate ?? "").matchAll(/\$\{([^}]+)\}/g))
        expect(a.groupByFields ?? [], `${chart}: legend ${name}`).toContain(name);
    }
  });

  test("the trigger's backlog is the subscription Eventarc made for this function's trigger, as the backlog alert selects it", () => {
    const backlog = dataSets().filter(({ chart }) => chart.startsWith("Trigger backlog"));
    expect(backlog).toHaveLength(2);
    for (const { set } of backlog)
      expect(filterOf(set)).toContain(`resource.labels.subscription_id=starts_with("eventarc-us-central1-${TRIGGER_ID}-sub-")`);
  });

  test("the task attempts are the module's three jobs' (a full-match regex on job_name), no other job's", () => {
    const set = dataSets().find(({ chart }) => chart.startsWith("Job task attempts"))?.set as Obj;
    const pattern = /resource\.labels\.job_name=monitoring\.regex\.full_match\("([^"]+)"\)/.exec(filterOf(set))?.[1] as string;
    const full = new RegExp(`^(?:${pattern})$`);
    for (const job of ["orbax2reg-plan", "orbax2reg-convert-group", "orbax2reg-finalize"]) expect(full.test(job), job).toBe(true);
    for (const job of ["orbax2reg-x-plan", "other-plan", "orbax2reg-plan-2", "orbax2reg-on-checkpoint"])
      expect(full.test(job), job).toBe(false);
  });

  test("the log-based metrics count the pipeline's own lines: the plan job's, the finalize job's, the function's, the export job's", () => {
    expect(logMetrics).toEqual({
      conversions_started: "orbax2reg/conversions_started",
      conversion_seconds: "orbax2reg/conversion_seconds",
      trigger_starts: "orbax2reg/trigger_starts",
      exports_committed: "orbax2reg/exports_committed",
      export_task_mb_per_second: "orbax2reg/export_task_mb_per_second",
    });
    const exportJob =
      'resource.type="cloud_run_job" AND resource.labels.job_name="orbax2reg-export" AND jsonPayload.component="orbax2reg-job"';
    expect(logFilters.exports_committed).toBe(`${exportJob} AND jsonPayload.message="export committed"`);
    expect(logFilters.export_task_mb_per_second).toBe(`${exportJob} AND jsonPayload.message="shards written"`);
    expect(logFilters.conversions_started).toBe(
      'resource.type="cloud_run_job" AND resource.labels.job_name="orbax2reg-plan" AND jsonPayload.component="orbax2reg-job" AND ' +
        '(jsonPayload.message="plan written" OR jsonPayload.message="reusing existing plan" OR jsonPayload.message="already converted; nothing to do")',
    );
    expect(logFilters.conversion_seconds).toBe(
      'resource.type="cloud_run_job" AND resource.labels.job_name="orbax2reg-finalize" AND jsonPayload.component="orbax2reg-job" AND jsonPayload.message="checkpoint committed"',
    );
    expect(logFilters.trigger_starts).toBe(
      'resource.type="cloud_run_revision" AND resource.labels.service_name="orbax2reg-on-checkpoint" AND jsonPayload.component="orbax2reg-trigger" AND jsonPayload.message="conversion started"',
    );
  });
});

describe("dashboard.tf", () => {
  test("creates nothing unless var.dashboard (off by default), and enables the Monitoring API with it", async () => {
    const vars = (await moduleFile("variables.tf")).variable as Record<string, Obj[]>;
    expect(vars.dashboard?.[0]?.default).toBe(false);
    const resources = (await moduleFile("dashboard.tf")).resource as Record<string, Record<string, Obj[]>>;
    expect(resources.google_monitoring_dashboard?.pipeline?.[0]?.count).toBe(ex("var.dashboard ? 1 : 0"));
    expect(resources.google_logging_metric?.pipeline?.[0]?.for_each).toMatch(/ if var\.dashboard \}\}$/);
    expect(readFileSync(join(MODULE, "apis.tf"), "utf8")).toContain('local.alerts || var.dashboard ? ["monitoring.googleapis.com"] : []');
  });

  test("the duration metric extracts the finalize line's conversionSeconds into a distribution", () => {
    expect(logMetricTable.conversion_seconds).toMatchObject({
      value_extractor: "EXTRACT(jsonPayload.conversionSeconds)",
      value_type: "DISTRIBUTION",
      unit: "s",
      exponential_buckets: { num_finite_buckets: 30, growth_factor: 1.6, scale: 1 },
    });
    // The counters extract nothing.
    for (const key of ["conversions_started", "trigger_starts"]) {
      expect(logMetricTable[key]?.value_extractor, key).toBeUndefined();
      expect(logMetricTable[key]).toMatchObject({ value_type: "INT64", unit: "1" });
    }
  });
});
