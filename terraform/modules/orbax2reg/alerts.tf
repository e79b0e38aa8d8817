# Failure alerts, only when notification_channels names at least one channel (none by default: nothing is created).
#
# What counts as a failed conversion: an execution of the conversion workflow that ends FAILED. Workflows writes an
# execution log at the end of every execution (https://cloud.google.com/workflows/docs/log-workflow, "Execution
# logs"), log workflows.googleapis.com/executions_system on the workflows.googleapis.com/Workflow resource, whose
# payload carries the state (ExecutionsSystemLog in googleapis/google/cloud/workflows/type/executions_system.proto:
# state FAILED, failure.exception). That line is there for every failure, also those after which convert.yaml cannot
# publish conversion.failed (an execution past its step limit, a ResourceLimitError); a job task that failed and was
# retried successfully is no failed conversion and raises no alert.
# https://registry.terraform.io/providers/hashicorp/google/latest/docs/resources/logging_metric
# https://registry.terraform.io/providers/hashicorp/google/latest/docs/resources/monitoring_alert_policy

locals {
  alerts = length(var.notification_channels) > 0

  # The log-based metric's filter (Logging query language: https://cloud.google.com/logging/docs/view/logging-query-language).
  failed_execution_filter = join(" AND ", [
    "resource.type=\"workflows.googleapis.com/Workflow\"",
    "resource.labels.workflow_id=\"${local.names.workflow}\"",
    "log_id(\"workflows.googleapis.com/executions_system\")",
    "jsonPayload.state=\"FAILED\"",
  ])
}

# A counter: one per failed execution of this deployment's workflow (DELTA, INT64, unit 1).
resource "google_logging_metric" "conversion_failures" {
  count = local.alerts ? 1 : 0

  project     = var.project_id
  name        = "${var.name_prefix}/conversion_failures"
  description = "Executions of the ${local.names.workflow} workflow (one orbax2reg conversion each) that ended FAILED."
  filter      = local.failed_execution_filter

  metric_descriptor {
    metric_kind  = "DELTA"
    value_type   = "INT64"
    unit         = "1"
    display_name = "${var.name_prefix} failed conversions"
  }

  depends_on = [google_project_service.required]
}

# Opens an incident, and notifies the channels, when any conversion failed in the last 5 minutes; it closes by itself
# 30 minutes after the last failure.
resource "google_monitoring_alert_policy" "conversion_failed" {
  count = local.alerts ? 1 : 0

  project               = var.project_id
  display_name          = "${var.name_prefix}: a conversion failed"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = var.labels

  conditions {
    display_name = "failed executions of ${local.names.workflow}"

    condition_threshold {
      filter          = "metric.type=\"logging.googleapis.com/user/${google_logging_metric.conversion_failures[0].name}\" AND resource.type=\"workflows.googleapis.com/Workflow\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"

      aggregations {
        alignment_period   = "300s"
        per_series_aligner = "ALIGN_SUM"
      }

      trigger {
        count = 1
      }

      # No failures is no data, not a problem.
      evaluation_missing_data = "EVALUATION_MISSING_DATA_INACTIVE"
    }
  }

  alert_strategy {
    auto_close = "1800s"
  }

  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      An execution of the `${local.names.workflow}` workflow (one orbax2reg conversion) failed in project `${var.project_id}`, region `${var.region}`; nothing was committed for that step.

      - Which one and why: `orbax2reg cloud status`, or the workflow's executions in the console (the error names the phase and group, from the jobs' failure reports).
      - The job logs: Cloud Run jobs `${local.names.plan_job}`, `${local.names.group_job}`, `${local.names.finalize_job}`.
      - To convert the step again: `orbax2reg cloud start` with the same source and destination (finished objects are skipped).
    EOT
  }

  depends_on = [google_project_service.required]
}
