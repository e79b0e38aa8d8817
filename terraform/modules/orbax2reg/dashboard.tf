# A Cloud Monitoring dashboard of the deployment, only when var.dashboard is true (off by default, like the alerts):
# conversions started, succeeded and failed, their duration, the bytes written, the checkpoint events delivered against
# those that started a conversion, the trigger's delivery backlog, and the jobs' task attempts by result.
# docs/operations.md, "The dashboard", says what each chart means and what to do when it looks wrong.
#
# Every metric charted exists in every project (Google's built-in metrics, https://cloud.google.com/monitoring/api/metrics_gcp_p_z:
# "pubsub", "run", "storage", "workflows") or is a log-based metric created here from the pipeline's own JSON log lines
# (https://cloud.google.com/logging/docs/logs-based-metrics; their type is logging.googleapis.com/user/<name>). The
# dashboard's JSON is the Dashboards API's Dashboard resource (https://cloud.google.com/monitoring/api/ref_v3/rest/v1/projects.dashboards;
# messages in google/monitoring/dashboard/v1/*.proto); test/terraform/dashboard.test.ts checks it against those messages.
# https://registry.terraform.io/providers/hashicorp/google/latest/docs/resources/monitoring_dashboard

locals {
  # Log-based metric names; the metric type is logging.googleapis.com/user/<name>.
  log_metrics = {
    # One per conversion planned: every execution of the workflow runs the plan job once (a retried plan job, or an
    # execution resumed by hand, plans again), and it logs exactly one of these lines when it has planned
    # (src/cloud/job/phases.ts).
    conversions_started = "${var.name_prefix}/conversions_started"
    # The finalize job's "checkpoint committed" line: conversionSeconds, from the plan to the index (src/cloud/job/phases.ts).
    conversion_seconds = "${var.name_prefix}/conversion_seconds"
    # The function's "conversion started" line: a commit marker that started a conversion (src/cloud/trigger/handler.ts).
    trigger_starts = "${var.name_prefix}/trigger_starts"
  }

  # Cloud Run job logs are on the cloud_run_job resource, labelled with job_name; a 2nd-gen function's on
  # cloud_run_revision, labelled with service_name (https://cloud.google.com/run/docs/logging).
  log_metric_filters = {
    conversions_started = join(" AND ", [
      "resource.type=\"cloud_run_job\"",
      "resource.labels.job_name=\"${local.names.plan_job}\"",
      "jsonPayload.component=\"orbax2reg-job\"",
      "(jsonPayload.message=\"plan written\" OR jsonPayload.message=\"reusing existing plan\" OR jsonPayload.message=\"already converted; nothing to do\")",
    ])
    conversion_seconds = join(" AND ", [
      "resource.type=\"cloud_run_job\"",
      "resource.labels.job_name=\"${local.names.finalize_job}\"",
      "jsonPayload.component=\"orbax2reg-job\"",
      "jsonPayload.message=\"checkpoint committed\"",
    ])
    trigger_starts = join(" AND ", [
      "resource.type=\"cloud_run_revision\"",
      "resource.labels.service_name=\"${local.names.function}\"",
      "jsonPayload.component=\"orbax2reg-trigger\"",
      "jsonPayload.message=\"conversion started\"",
    ])
  }

  # One time series query of the Dashboards API (TimeSeriesQuery.timeSeriesFilter, Aggregation: metrics.proto, common.proto).
  # Filters in the Monitoring filter syntax, starts_with() and monitoring.regex.full_match() included (https://cloud.google.com/monitoring/api/v3/filters);
  # the trigger's subscription is selected as the backlog alert selects it (alerts.tf).
  dashboard_query = {
    for k, q in {
      started = {
        filter  = "metric.type=\"logging.googleapis.com/user/${local.log_metrics.conversions_started}\" AND resource.type=\"cloud_run_job\""
        aligner = "ALIGN_SUM", reducer = "REDUCE_SUM", period = "300s", group = []
      }
      finished = {
        filter  = "metric.type=\"workflows.googleapis.com/finished_execution_count\" AND resource.type=\"workflows.googleapis.com/Workflow\" AND resource.labels.workflow_id=\"${local.names.workflow}\" AND resource.labels.location=\"${var.region}\""
        aligner = "ALIGN_SUM", reducer = "REDUCE_SUM", period = "300s", group = ["metric.labels.status"]
      }
      duration_p50 = {
        filter  = "metric.type=\"logging.googleapis.com/user/${local.log_metrics.conversion_seconds}\" AND resource.type=\"cloud_run_job\""
        aligner = "ALIGN_DELTA", reducer = "REDUCE_PERCENTILE_50", period = "3600s", group = []
      }
      duration_p95 = {
        filter  = "metric.type=\"logging.googleapis.com/user/${local.log_metrics.conversion_seconds}\" AND resource.type=\"cloud_run_job\""
        aligner = "ALIGN_DELTA", reducer = "REDUCE_PERCENTILE_95", period = "3600s", group = []
      }
      bytes = {
        filter  = "metric.type=\"storage.googleapis.com/network/received_bytes_count\" AND resource.type=\"gcs_bucket\" AND resource.labels.bucket_name=\"${local.destination_bucket}\""
        aligner = "ALIGN_SUM", reducer = "REDUCE_SUM", period = "300s", group = []
      }
      deliveries = {
        filter  = "metric.type=\"run.googleapis.com/request_count\" AND resource.type=\"cloud_run_revision\" AND resource.labels.service_name=\"${local.names.function}\""
        aligner = "ALIGN_SUM", reducer = "REDUCE_SUM", period = "300s", group = ["metric.labels.response_code_class"]
      }
      trigger_starts = {
        filter  = "metric.type=\"logging.googleapis.com/user/${local.log_metrics.trigger_starts}\" AND resource.type=\"cloud_run_revision\""
        aligner = "ALIGN_SUM", reducer = "REDUCE_SUM", period = "300s", group = []
      }
      backlog_age = {
        filter  = local.event_backlog_filter
        aligner = "ALIGN_MAX", reducer = "REDUCE_MAX", period = "60s", group = []
      }
      backlog_count = {
        filter  = "metric.type=\"pubsub.googleapis.com/subscription/num_undelivered_messages\" AND resource.type=\"pubsub_subscription\" AND resource.labels.subscription_id=starts_with(\"${local.trigger_subscription_prefix}\")"
        aligner = "ALIGN_MAX", reducer = "REDUCE_MAX", period = "60s", group = []
      }
      task_attempts = {
        filter  = "metric.type=\"run.googleapis.com/job/completed_task_attempt_count\" AND resource.type=\"cloud_run_job\" AND resource.labels.job_name=monitoring.regex.full_match(\"${var.name_prefix}-(plan|convert-group|finalize)\")"
        aligner = "ALIGN_SUM", reducer = "REDUCE_SUM", period = "300s", group = ["resource.labels.job_name", "metric.labels.result"]
      }
      } : k => {
      timeSeriesFilter = {
        filter = q.filter
        aggregation = merge(
          { alignmentPeriod = q.period, perSeriesAligner = q.aligner, crossSeriesReducer = q.reducer },
          length(q.group) > 0 ? { groupByFields = q.group } : {},
        )
      }
    }
  }

  # A chart of one or more data sets (XyChart, xychart.proto).
  dashboard_charts = [
    {
      title = "Conversions: started, and finished by status"
      dataSets = [
        { timeSeriesQuery = local.dashboard_query.started, plotType = "LINE", legendTemplate = "started (planned)" },
        { timeSeriesQuery = local.dashboard_query.finished, plotType = "STACKED_BAR", legendTemplate = "$${metric.labels.status}" },
      ]
      yAxis = { label = "conversions / 5 min", scale = "LINEAR" }
    },
    {
      title = "Conversion duration, plan to commit (seconds)"
      dataSets = [
        { timeSeriesQuery = merge(local.dashboard_query.duration_p50, { unitOverride = "s" }), plotType = "LINE", legendTemplate = "median" },
        { timeSeriesQuery = merge(local.dashboard_query.duration_p95, { unitOverride = "s" }), plotType = "LINE", legendTemplate = "95th percentile" },
      ]
      yAxis = { label = "seconds", scale = "LINEAR" }
    },
    {
      title = "Bytes written to gs://${local.destination_bucket}"
      dataSets = [
        { timeSeriesQuery = merge(local.dashboard_query.bytes, { unitOverride = "By" }), plotType = "STACKED_BAR", legendTemplate = "bytes received" },
      ]
      yAxis = { label = "bytes / 5 min", scale = "LINEAR" }
    },
    {
      title = "Checkpoint events: delivered to the function, and those that started a conversion"
      dataSets = [
        { timeSeriesQuery = local.dashboard_query.deliveries, plotType = "LINE", legendTemplate = "delivered, answered $${metric.labels.response_code_class}" },
        { timeSeriesQuery = local.dashboard_query.trigger_starts, plotType = "LINE", legendTemplate = "started a conversion" },
      ]
      yAxis = { label = "events / 5 min", scale = "LOG10" }
    },
    {
      title = "Trigger backlog: age of the oldest unacknowledged event (seconds)"
      dataSets = [
        { timeSeriesQuery = merge(local.dashboard_query.backlog_age, { unitOverride = "s" }), plotType = "LINE", legendTemplate = "oldest unacknowledged" },
      ]
      thresholds = [{ label = "backlog alert", value = var.event_backlog_alert_seconds }]
      yAxis      = { label = "seconds", scale = "LINEAR" }
    },
    {
      title = "Trigger backlog: unacknowledged events"
      dataSets = [
        { timeSeriesQuery = local.dashboard_query.backlog_count, plotType = "LINE", legendTemplate = "unacknowledged" },
      ]
      yAxis = { label = "events", scale = "LINEAR" }
    },
    {
      title = "Job task attempts by result (a failed attempt is retried up to max_retries times)"
      dataSets = [
        { timeSeriesQuery = local.dashboard_query.task_attempts, plotType = "STACKED_BAR", legendTemplate = "$${resource.labels.job_name} $${metric.labels.result}" },
      ]
      yAxis = { label = "attempts / 5 min", scale = "LINEAR" }
    },
  ]

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
    [for i, chart in local.dashboard_charts : {
      position = { xPos = (i % 2) * 6, yPos = floor(i / 2) * 4 }
      widget   = { title = chart.title, xyChart = { for k, v in chart : k => v if k != "title" } }
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

resource "google_logging_metric" "count" {
  for_each = var.dashboard ? toset(["conversions_started", "trigger_starts"]) : toset([])

  project = var.project_id
  name    = local.log_metrics[each.key]
  filter  = local.log_metric_filters[each.key]

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
  }

  depends_on = [google_project_service.required]
}

# A distribution of the conversions' durations (seconds): 30 exponential buckets from 1 s growing by 1.6, the last
# finite one ending at ~15 days (a conversion waits at most 7 days for one job: workflow-argument.ts, MAX_JOB_TIMEOUT).
resource "google_logging_metric" "conversion_seconds" {
  count = var.dashboard ? 1 : 0

  project         = var.project_id
  name            = local.log_metrics.conversion_seconds
  filter          = local.log_metric_filters.conversion_seconds
  value_extractor = "EXTRACT(jsonPayload.conversionSeconds)"

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "DISTRIBUTION"
    unit        = "s"
  }

  bucket_options {
    exponential_buckets {
      num_finite_buckets = 30
      growth_factor      = 1.6
      scale              = 1
    }
  }

  depends_on = [google_project_service.required]
}

resource "google_monitoring_dashboard" "pipeline" {
  count = var.dashboard ? 1 : 0

  project        = var.project_id
  dashboard_json = jsonencode(local.dashboard)

  # A chart may name a log-based metric before its first point exists; it is created first all the same.
  depends_on = [google_project_service.required, google_logging_metric.count, google_logging_metric.conversion_seconds]
}
