# A Cloud Monitoring dashboard of the deployment, only when var.dashboard is true (off by default, like the alerts):
# conversions started, succeeded and failed, their duration, the bytes written, the checkpoint events delivered against
# those that started a conversion, the trigger's delivery backlog, and the jobs' task attempts by result.
# docs/operations.md, "The dashboard", says what each chart means and what to do when it looks wrong.
#
# Every metric charted exists in every project (Google's built-in metrics, https://cloud.google.com/monitoring/api/metrics_gcp_p_z:
# "pubsub", "run", "storage", "workflows") or is a log-based metric created here from the pipeline's own JSON log lines
# (https://cloud.google.com/logging/docs/logs-based-metrics; their type is logging.googleapis.com/user/<name>); both are
# defined in monitoring.tf, and a chart names them by their key there. The
# dashboard's JSON is the Dashboards API's Dashboard resource (https://cloud.google.com/monitoring/api/ref_v3/rest/v1/projects.dashboards;
# messages in google/monitoring/dashboard/v1/*.proto); test/terraform/dashboard.test.ts checks it against those messages.
# https://registry.terraform.io/providers/hashicorp/google/latest/docs/resources/monitoring_dashboard

locals {
  # Aggregations (Aggregation: common.proto) the charts use, by name: per 5 minutes or per minute, summed or the
  # largest over the selected series; the median and 95th percentile of a distribution per hour.
  dashboard_aggregations = {
    sum_5min = { alignmentPeriod = "300s", perSeriesAligner = "ALIGN_SUM", crossSeriesReducer = "REDUCE_SUM" }
    max_1min = { alignmentPeriod = "60s", perSeriesAligner = "ALIGN_MAX", crossSeriesReducer = "REDUCE_MAX" }
    p50_1h   = { alignmentPeriod = "3600s", perSeriesAligner = "ALIGN_DELTA", crossSeriesReducer = "REDUCE_PERCENTILE_50" }
    p95_1h   = { alignmentPeriod = "3600s", perSeriesAligner = "ALIGN_DELTA", crossSeriesReducer = "REDUCE_PERCENTILE_95" }
  }

  # The charts (XyChart, xychart.proto), in this order, with their y axis and, optionally, thresholds. Each data set is
  # a time series of monitoring.tf (`series`), aggregated as `aggregation` names, grouped by the labels `group` lists
  # (when given), plotted as `plot`, named by `legend`, in the unit `unit` (when given). The trigger's backlog is
  # selected as the backlog alert selects it (alerts.tf).
  dashboard_charts = concat([
    {
      title = "Conversions: started, and finished by status"
      yAxis = { label = "conversions / 5 min", scale = "LINEAR" }
      data = [
        { series = "conversions_started", aggregation = "sum_5min", plot = "LINE", legend = "started (planned)" },
        { series = "finished_executions", aggregation = "sum_5min", group = ["metric.labels.status"], plot = "STACKED_BAR", legend = "$${metric.labels.status}" },
      ]
    },
    {
      title = "Conversion duration, plan to commit (seconds)"
      yAxis = { label = "seconds", scale = "LINEAR" }
      data = [
        { series = "conversion_seconds", aggregation = "p50_1h", unit = "s", plot = "LINE", legend = "median" },
        { series = "conversion_seconds", aggregation = "p95_1h", unit = "s", plot = "LINE", legend = "95th percentile" },
      ]
    },
    {
      title = "Bytes written to gs://${local.destination_bucket}"
      yAxis = { label = "bytes / 5 min", scale = "LINEAR" }
      data = [
        { series = "bytes_written", aggregation = "sum_5min", unit = "By", plot = "STACKED_BAR", legend = "bytes received" },
      ]
    },
    {
      title = "Checkpoint events: delivered to the function, and those that started a conversion"
      yAxis = { label = "events / 5 min", scale = "LOG10" }
      data = [
        { series = "deliveries", aggregation = "sum_5min", group = ["metric.labels.response_code_class"], plot = "LINE", legend = "delivered, answered $${metric.labels.response_code_class}" },
        { series = "trigger_starts", aggregation = "sum_5min", plot = "LINE", legend = "started a conversion" },
      ]
    },
    {
      title      = "Trigger backlog: age of the oldest unacknowledged event (seconds)"
      yAxis      = { label = "seconds", scale = "LINEAR" }
      thresholds = [{ label = "backlog alert", value = var.event_backlog_alert_seconds }]
      data = [
        { series = "backlog_age", aggregation = "max_1min", unit = "s", plot = "LINE", legend = "oldest unacknowledged" },
      ]
    },
    {
      title = "Trigger backlog: unacknowledged events"
      yAxis = { label = "events", scale = "LINEAR" }
      data = [
        { series = "backlog_count", aggregation = "max_1min", plot = "LINE", legend = "unacknowledged" },
      ]
    },
    {
      title = "Job task attempts by result (a failed attempt is retried up to max_retries times)"
      yAxis = { label = "attempts / 5 min", scale = "LINEAR" }
      data = [
        { series = "task_attempts", aggregation = "sum_5min", group = ["resource.labels.job_name", "metric.labels.result"], plot = "STACKED_BAR", legend = "$${resource.labels.job_name} $${metric.labels.result}" },
      ]
    },
    ],
    # With hf_export: the exports committed (their failures are the FAILED bars above: an export fails its execution)
    # and how fast each export-shards task wrote, from the export job's lines (monitoring.tf).
    [for c in [
      {
        title = "Hugging Face exports committed"
        yAxis = { label = "exports / 5 min", scale = "LINEAR" }
        data = [
          { series = "exports_committed", aggregation = "sum_5min", plot = "STACKED_BAR", legend = "committed" },
        ]
      },
      {
        title = "Hugging Face export: shard-writing speed per task (MB/s)"
        yAxis = { label = "MB/s", scale = "LINEAR" }
        data = [
          { series = "export_task_mb_per_second", aggregation = "p50_1h", unit = "MBy/s", plot = "LINE", legend = "median" },
          { series = "export_task_mb_per_second", aggregation = "p95_1h", unit = "MBy/s", plot = "LINE", legend = "95th percentile" },
        ]
      },
    ] : c if local.export_on],
  )

  # The charts as the Dashboards API takes them: a data set's TimeSeriesQuery.timeSeriesFilter (metrics.proto), the
  # options not given left out (null is dropped).
  dashboard_widgets = [for c in local.dashboard_charts : {
    title = c.title
    xyChart = { for k, v in {
      yAxis      = c.yAxis
      thresholds = lookup(c, "thresholds", null)
      dataSets = [for d in c.data : {
        plotType       = d.plot
        legendTemplate = d.legend
        timeSeriesQuery = { for k, v in {
          timeSeriesFilter = {
            filter      = local.series_filters[d.series]
            aggregation = { for k, v in merge(local.dashboard_aggregations[d.aggregation], { groupByFields = lookup(d, "group", null) }) : k => v if v != null }
          }
          unitOverride = lookup(d, "unit", null)
        } : k => v if v != null }
      }]
    } : k => v if v != null }
  }]

  dashboard_text = <<-EOT
    **orbax2reg** `${var.name_prefix}` in `${var.project_id}` (${var.region}): what each chart means, and what to do when one looks wrong, is in the repository's docs/operations.md, "The dashboard".

    - `orbax2reg cloud status <checkpoint-root>`: where every step stands.
    - `orbax2reg cloud backfill <checkpoint-root>`: start every committed step that has no conversion.
  EOT

  # Two charts a row on a 12-column mosaic (MosaicLayout: layouts.proto), the text last. A position of 0 is left out:
  # the API answers without zero-valued fields (proto3 JSON), and the provider compares the JSON it reads back with
  # this one key by key, so an xPos or yPos of 0 here would show as a change at every plan
  # (hashicorp/terraform-provider-google#16173; test/terraform/later-apply.test.ts plans a deployed dashboard again).
  dashboard_tiles = concat(
    [for i, widget in local.dashboard_widgets : {
      position = { xPos = (i % 2) * 6, yPos = floor(i / 2) * 4 }
      widget   = widget
    }],
    [{
      position = { xPos = (length(local.dashboard_charts) % 2) * 6, yPos = floor(length(local.dashboard_charts) / 2) * 4 }
      widget   = { title = "About this dashboard", text = { content = local.dashboard_text, format = "MARKDOWN" } }
    }],
  )
  dashboard = {
    displayName = "${var.name_prefix}: checkpoint conversions"
    mosaicLayout = {
      columns = 12
      tiles = [for t in local.dashboard_tiles : merge(
        { for k, v in t.position : k => v if v != 0 },
        { width = 6, height = 4, widget = t.widget },
      )]
    }
  }
}

# The log-based metrics of monitoring.tf (`log_metrics`): a counter, or a distribution with its value extractor and
# buckets. https://registry.terraform.io/providers/hashicorp/google/latest/docs/resources/logging_metric
resource "google_logging_metric" "pipeline" {
  for_each = { for k, m in local.log_metrics : k => merge({ value_extractor = null, exponential_buckets = null }, m) if var.dashboard }

  project         = var.project_id
  name            = local.log_metric_names[each.key]
  filter          = local.log_metric_filters[each.key]
  value_extractor = each.value.value_extractor

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = each.value.value_type
    unit        = each.value.unit
  }

  dynamic "bucket_options" {
    for_each = each.value.exponential_buckets[*]
    content {
      exponential_buckets {
        num_finite_buckets = bucket_options.value.num_finite_buckets
        growth_factor      = bucket_options.value.growth_factor
        scale              = bucket_options.value.scale
      }
    }
  }

  depends_on = [google_project_service.required]
}

# The log-based metrics were two resources before (the counters, and the distribution with count = 0 or 1): a later
# apply moves them, not replaces them (https://developer.hashicorp.com/terraform/language/modules/develop/refactoring).
moved {
  from = google_logging_metric.count["conversions_started"]
  to   = google_logging_metric.pipeline["conversions_started"]
}
moved {
  from = google_logging_metric.count["trigger_starts"]
  to   = google_logging_metric.pipeline["trigger_starts"]
}
moved {
  from = google_logging_metric.conversion_seconds[0]
  to   = google_logging_metric.pipeline["conversion_seconds"]
}

resource "google_monitoring_dashboard" "pipeline" {
  count = var.dashboard ? 1 : 0

  project        = var.project_id
  dashboard_json = jsonencode(local.dashboard)

  # A chart may name a log-based metric before its first point exists; it is created first all the same.
  depends_on = [google_project_service.required, google_logging_metric.pipeline]
}
