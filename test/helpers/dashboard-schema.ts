// The part of the Cloud Monitoring Dashboards API's Dashboard resource that the module's dashboard uses
// (https://cloud.google.com/monitoring/api/ref_v3/rest/v1/projects.dashboards), as its messages define it in
// googleapis/googleapis, google/monitoring/dashboard/v1: dashboard.proto (Dashboard), layouts.proto (MosaicLayout, Tile),
// widget.proto (Widget), xychart.proto (XyChart, DataSet, Axis), metrics.proto (TimeSeriesQuery, TimeSeriesFilter,
// Threshold), common.proto (Aggregation: Aligner, Reducer), text.proto (Text). Field names are the JSON (lowerCamelCase)
// forms; a Duration is a string of seconds with an "s" suffix. Written from those files, for the checks
// test/terraform/dashboard.test.ts makes; fields the module does not use are listed where a message has them, so an
// unknown field is still an error.

type Kind =
  | { readonly type: "string" | "number" | "integer" | "duration" }
  | { readonly type: "enum"; readonly values: readonly string[] }
  | { readonly type: "message"; readonly message: string }
  | { readonly type: "repeated"; readonly of: Kind };

interface Message {
  readonly fields: Readonly<Record<string, Kind>>;
  readonly required?: readonly string[];
  /** Sets of fields of which at most one may be set (a proto oneof); `exactlyOne` when the message needs one. */
  readonly oneofs?: readonly { readonly fields: readonly string[]; readonly exactlyOne?: boolean }[];
}

const str = { type: "string" } as const;
const num = { type: "number" } as const;
const int = { type: "integer" } as const;
const duration = { type: "duration" } as const;
const msg = (message: string) => ({ type: "message", message }) as const;
const list = (of: Kind) => ({ type: "repeated", of }) as const;
const oneOf = (...values: string[]) => ({ type: "enum", values }) as const;

/** common.proto, Aggregation.Aligner. */
export const ALIGNERS = [
  "ALIGN_NONE",
  "ALIGN_DELTA",
  "ALIGN_RATE",
  "ALIGN_INTERPOLATE",
  "ALIGN_NEXT_OLDER",
  "ALIGN_MIN",
  "ALIGN_MAX",
  "ALIGN_MEAN",
  "ALIGN_COUNT",
  "ALIGN_SUM",
  "ALIGN_STDDEV",
  "ALIGN_COUNT_TRUE",
  "ALIGN_COUNT_FALSE",
  "ALIGN_FRACTION_TRUE",
  "ALIGN_PERCENTILE_99",
  "ALIGN_PERCENTILE_95",
  "ALIGN_PERCENTILE_50",
  "ALIGN_PERCENTILE_05",
  "ALIGN_PERCENT_CHANGE",
] as const;

/** common.proto, Aggregation.Reducer. */
export const REDUCERS = [
  "REDUCE_NONE",
  "REDUCE_MEAN",
  "REDUCE_MIN",
  "REDUCE_MAX",
  "REDUCE_SUM",
  "REDUCE_STDDEV",
  "REDUCE_COUNT",
  "REDUCE_COUNT_TRUE",
  "REDUCE_COUNT_FALSE",
  "REDUCE_FRACTION_TRUE",
  "REDUCE_PERCENTILE_99",
  "REDUCE_PERCENTILE_95",
  "REDUCE_PERCENTILE_50",
  "REDUCE_PERCENTILE_05",
] as const;

export const MESSAGES: Readonly<Record<string, Message>> = {
  Dashboard: {
    fields: {
      name: str,
      displayName: str,
      etag: str,
      gridLayout: msg("GridLayout"),
      mosaicLayout: msg("MosaicLayout"),
      rowLayout: msg("RowLayout"),
      columnLayout: msg("ColumnLayout"),
    },
    required: ["displayName"],
    oneofs: [{ fields: ["gridLayout", "mosaicLayout", "rowLayout", "columnLayout"] }],
  },
  GridLayout: { fields: { columns: int, widgets: list(msg("Widget")) } },
  RowLayout: { fields: { rows: list(msg("Row")) } },
  Row: { fields: { weight: int, widgets: list(msg("Widget")) } },
  ColumnLayout: { fields: { columns: list(msg("Column")) } },
  Column: { fields: { weight: int, widgets: list(msg("Widget")) } },
  MosaicLayout: { fields: { columns: int, tiles: list(msg("Tile")) } },
  Tile: { fields: { xPos: int, yPos: int, width: int, height: int, widget: msg("Widget") } },
  Widget: {
    fields: { title: str, xyChart: msg("XyChart"), scorecard: msg("Scorecard"), text: msg("Text"), blank: msg("Empty") },
    oneofs: [{ fields: ["xyChart", "scorecard", "text", "blank"], exactlyOne: true }],
  },
  Empty: { fields: {} },
  Scorecard: { fields: { timeSeriesQuery: msg("TimeSeriesQuery"), thresholds: list(msg("Threshold")) } },
  Text: { fields: { content: str, format: oneOf("FORMAT_UNSPECIFIED", "MARKDOWN", "RAW") } },
  XyChart: {
    fields: {
      dataSets: list(msg("DataSet")),
      timeshiftDuration: duration,
      thresholds: list(msg("Threshold")),
      xAxis: msg("Axis"),
      yAxis: msg("Axis"),
      y2Axis: msg("Axis"),
      chartOptions: msg("ChartOptions"),
    },
    required: ["dataSets"],
  },
  DataSet: {
    fields: {
      timeSeriesQuery: msg("TimeSeriesQuery"),
      plotType: oneOf("PLOT_TYPE_UNSPECIFIED", "LINE", "STACKED_AREA", "STACKED_BAR", "HEATMAP"),
      legendTemplate: str,
      minAlignmentPeriod: duration,
      targetAxis: oneOf("TARGET_AXIS_UNSPECIFIED", "Y1", "Y2"),
    },
    required: ["timeSeriesQuery"],
  },
  Axis: { fields: { label: str, scale: oneOf("SCALE_UNSPECIFIED", "LINEAR", "LOG10") } },
  ChartOptions: { fields: { mode: oneOf("MODE_UNSPECIFIED", "COLOR", "X_RAY", "STATS") } },
  Threshold: {
    fields: {
      label: str,
      value: num,
      color: oneOf("COLOR_UNSPECIFIED", "YELLOW", "RED"),
      direction: oneOf("DIRECTION_UNSPECIFIED", "ABOVE", "BELOW"),
    },
  },
  TimeSeriesQuery: {
    fields: {
      timeSeriesFilter: msg("TimeSeriesFilter"),
      timeSeriesFilterRatio: msg("TimeSeriesFilterRatio"),
      timeSeriesQueryLanguage: str,
      unitOverride: str,
    },
    oneofs: [{ fields: ["timeSeriesFilter", "timeSeriesFilterRatio", "timeSeriesQueryLanguage"], exactlyOne: true }],
  },
  TimeSeriesFilter: {
    fields: {
      filter: str,
      aggregation: msg("Aggregation"),
      secondaryAggregation: msg("Aggregation"),
      pickTimeSeriesFilter: msg("PickTimeSeriesFilter"),
    },
    required: ["filter"],
  },
  TimeSeriesFilterRatio: {
    fields: { numerator: msg("RatioPart"), denominator: msg("RatioPart"), secondaryAggregation: msg("Aggregation") },
  },
  RatioPart: { fields: { filter: str, aggregation: msg("Aggregation") }, required: ["filter"] },
  PickTimeSeriesFilter: {
    fields: {
      rankingMethod: oneOf("METHOD_MEAN", "METHOD_MAX", "METHOD_MIN", "METHOD_SUM", "METHOD_LATEST"),
      numTimeSeries: int,
      direction: oneOf("TOP", "BOTTOM"),
    },
  },
  Aggregation: {
    fields: {
      alignmentPeriod: duration,
      perSeriesAligner: { type: "enum", values: ALIGNERS },
      crossSeriesReducer: { type: "enum", values: REDUCERS },
      groupByFields: list(str),
    },
  },
};

/** Every way `value` departs from `message`, as "path: what" lines; [] when it conforms. */
export function schemaErrors(value: unknown, message = "Dashboard", path = "$"): string[] {
  const m = MESSAGES[message];
  if (m === undefined) return [`${path}: no message ${message} in the schema`];
  if (typeof value !== "object" || value === null || Array.isArray(value)) return [`${path}: ${message} must be an object`];
  const obj = value as Record<string, unknown>;
  const errors: string[] = [];
  for (const [k, v] of Object.entries(obj)) {
    const kind = m.fields[k];
    if (kind === undefined) errors.push(`${path}.${k}: not a field of ${message}`);
    else errors.push(...kindErrors(v, kind, `${path}.${k}`));
  }
  for (const r of m.required ?? []) if (!(r in obj)) errors.push(`${path}: ${message}.${r} is required`);
  for (const o of m.oneofs ?? []) {
    const set = o.fields.filter((f) => f in obj);
    if (set.length > 1) errors.push(`${path}: at most one of ${o.fields.join(", ")} (oneof), got ${set.join(", ")}`);
    if (o.exactlyOne && set.length === 0) errors.push(`${path}: one of ${o.fields.join(", ")} is needed`);
  }
  return errors;
}

function kindErrors(v: unknown, kind: Kind, path: string): string[] {
  switch (kind.type) {
    case "string":
      return typeof v === "string" ? [] : [`${path}: must be a string`];
    case "number":
      return typeof v === "number" ? [] : [`${path}: must be a number`];
    case "integer":
      return Number.isInteger(v) ? [] : [`${path}: must be an integer`];
    case "duration":
      return typeof v === "string" && /^\d+(\.\d+)?s$/.test(v) ? [] : [`${path}: must be a Duration ("300s")`];
    case "enum":
      return typeof v === "string" && kind.values.includes(v)
        ? []
        : [`${path}: ${JSON.stringify(v)} is not one of ${kind.values.join(", ")}`];
    case "message":
      return schemaErrors(v, kind.message, path);
    case "repeated":
      return Array.isArray(v) ? v.flatMap((x, i) => kindErrors(x, kind.of, `${path}[${i}]`)) : [`${path}: must be a list`];
  }
}

/** Seconds of a Duration string. */
export const seconds = (d: string): number => Number(d.replace(/s$/, ""));
