# Failure alerts, only when notification_channels names at least one channel (none by default: nothing is created).
# Two policies, one for each side of the pipeline:
#
# 1. A conversion failed: an execution of the conversion workflow ended FAILED. Counted by Workflows' own metric
#    workflows.googleapis.com/finished_execution_count (BETA, DELTA, INT64; labels `status`, "the execution status of
#    the workflow", and revision_id; on the monitored resource workflows.googleapis.com/Workflow, labels
#    resource_container, location, workflow_id: https://cloud.google.com/monitoring/api/metrics_gcp_p_z, "workflows";
#    https://cloud.google.com/monitoring/api/resources; https://cloud.google.com/workflows/docs/monitor). The page does
#    not list the label's values; FAILED is the execution state's name (Execution.State in the Executions API).
#    A built-in metric exists in every project from the start, so the policy is accepted at the first apply (a
#    log-based metric's descriptor can still be missing when the policy that names it is created), and it counts every
#    FAILED end, also those after which convert.yaml cannot publish conversion.failed (an execution past its step limit).
#    A job task that failed and was retried successfully is no failed conversion and raises no alert.
# 2. An event was dropped: a commit marker that never becomes an execution never reaches the workflow, so (1) cannot
#    see it. The function writes one ERROR line for each way an event is dropped (the start refused, a misconfigured
#    function acknowledging every event, an event the handler gave up on, a delivery failing for longer than
#    src/cloud/trigger/severity.ts allows: a claim that stays busy), and the policy matches those lines as they arrive
#    (a log-match condition: https://cloud.google.com/logging/docs/alerting/log-based-alerts). A dead-letter topic cannot do
#    this here: Eventarc creates and owns the trigger's Pub/Sub subscription (https://cloud.google.com/eventarc/docs/retry-events),
#    so terraform cannot set one on it, and a dead-lettered event is one that failed for 24 h, a day late.
# https://registry.terraform.io/providers/hashicorp/google/latest/docs/resources/monitoring_alert_policy

locals {
  alerts = length(var.notification_channels) > 0

  # Monitoring filter (https://cloud.google.com/monitoring/api/v3/filters) of the failed executions of this deployment's
  # workflow.
  failed_execution_filter = join(" AND ", [
    "metric.type=\"workflows.googleapis.com/finished_execution_count\"",
    "metric.labels.status=\"FAILED\"",
    "resource.type=\"workflows.googleapis.com/Workflow\"",
    "resource.labels.workflow_id=\"${local.names.workflow}\"",
    "resource.labels.location=\"${var.region}\"",
  ])

  # Logging query (https://cloud.google.com/logging/docs/view/logging-query-language) of the function's ERROR lines: its
  # own JSON lines (src/cloud/api/log.ts, component orbax2reg-trigger), on the Cloud Run service a 2nd-gen function runs
  # as (resource cloud_run_revision, service_name = the function's name: https://cloud.google.com/run/docs/logging). The
  # framework's own stack trace after a retryable failure is not matched: that event is redelivered, not dropped.
  dropped_event_filter = join(" AND ", [
    "resource.type=\"cloud_run_revision\"",
    "resource.labels.service_name=\"${local.names.function}\"",
    "jsonPayload.component=\"orbax2reg-trigger\"",
    "severity>=ERROR",
  ])
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
      filter          = local.failed_execution_filter
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

# Opens an incident on the first ERROR line of the function: an event that will never start a conversion. At most one
# notification per 5 minutes (a rate limit is "required for alert policies with a LogMatch condition":
# https://cloud.google.com/python/docs/reference/monitoring/latest/google.cloud.monitoring_v3.types.AlertPolicy.AlertStrategy);
# closes 30 minutes after the last line.
resource "google_monitoring_alert_policy" "event_dropped" {
  count = local.alerts ? 1 : 0

  project               = var.project_id
  display_name          = "${var.name_prefix}: a checkpoint event was dropped"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = var.labels

  conditions {
    display_name = "ERROR lines of ${local.names.function}"

    condition_matched_log {
      filter = local.dropped_event_filter
    }
  }

  alert_strategy {
    notification_rate_limit {
      period = "300s"
    }
    auto_close = "1800s"
  }

  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      The function `${local.names.function}` (project `${var.project_id}`) dropped a Cloud Storage event, or has been failing to handle one for long: a committed step may not be converted. Its ERROR line says which:

      - `the workflow refused to start: ...`: the Workflows API refused the execution (a bad argument, a deleted workflow). Fix the cause, then `orbax2reg cloud start` the step.
      - `misconfigured, events are acknowledged and ignored until redeployed: ...`: an environment variable of the function is wrong; every event is dropped until `terraform apply` redeploys it. Then `orbax2reg cloud backfill` the steps committed meanwhile.
      - `... still failing ... after ...`: a delivery has been retried for that long (a claim that stays busy, an API that keeps failing); Eventarc drops the event 24 hours after it was sent. See the line's `errorKind` and the function's other lines.
      - any other ERROR line: the event or what it names was rejected for good (`errorKind`, `retryable: false`).

      `orbax2reg cloud status` lists the steps and their executions.
    EOT
  }

  depends_on = [google_project_service.required]
}
