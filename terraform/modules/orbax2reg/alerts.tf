# Failure alerts, only when notification_channels names at least one channel (none by default: nothing is created).
# Three policies, so that whatever way a committed step fails to be converted, an operator hears of it:
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
# 2. An event was dropped by the function: a commit marker that never becomes an execution never reaches the workflow,
#    so (1) cannot see it. The function writes one ERROR line for each way it drops an event (the start refused, a
#    misconfigured function acknowledging every event, an event the handler gave up on, a delivery failing for longer
#    than src/cloud/trigger/severity.ts allows: a claim that stays busy), and the policy matches those lines as they
#    arrive (a log-match condition: https://cloud.google.com/logging/docs/alerting/log-based-alerts).
# 3. An event is not being delivered: a delivery refused before the function runs (429 at max_instance_count, 403 while
#    IAM propagates, an instance that crashes before its first line) writes no line of the function's, and Eventarc
#    redelivers it for 24 h, then discards it (https://cloud.google.com/eventarc/docs/retry-events). Every such event
#    stays unacknowledged in the trigger's Pub/Sub subscription meanwhile, so the policy watches the age of the oldest
#    unacknowledged message there (see event_backlog below).
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

  # The Eventarc trigger the function's event_trigger creates is "projects/<p>/locations/<region>/triggers/<id>" (the
  # provider's `event_trigger.trigger`, output only), and the Pub/Sub subscription Eventarc creates for it is named
  # "eventarc-<region>-<trigger id>-sub-<number>" (https://cloud.google.com/eventarc/docs/retry-events: "projects/
  # PROJECT_ID/subscriptions/eventarc-REGION-TRIGGER_ID-sub-SUBSCRIPTION_ID"). Terraform does not manage that
  # subscription (Eventarc creates and owns it; the provider has no attribute for it:
  # https://github.com/hashicorp/terraform-provider-google/issues/17697), so the policy selects it by that prefix, a
  # Monitoring filter's starts_with() (https://cloud.google.com/monitoring/api/v3/filters). Derived from the trigger's
  # own name, the filter follows a trigger that a later apply recreates (a new id) without anything to do by hand. The
  # trigger's reference promises no more than a subscription "created and managed by Eventarc" (and names have started
  # eventarc-REGION-), so `orbax2reg cloud check` fails when the subscription does not start with this prefix
  # (src/cloud/ops/check-delivery.ts): a renamed one cannot silence the alert unseen.
  trigger_id                  = element(reverse(split("/", google_cloudfunctions2_function.on_checkpoint.event_trigger[0].trigger)), 0)
  trigger_subscription_prefix = "eventarc-${local.trigger_region}-${local.trigger_id}-sub-"

  # pubsub.googleapis.com/subscription/oldest_unacked_message_age (GA; GAUGE, INT64, seconds; monitored resource
  # pubsub_subscription, labels project_id and subscription_id; "Sampled every 60 seconds. After sampling, data is not
  # visible for up to 120 seconds": https://cloud.google.com/monitoring/api/metrics_gcp_p_z, "pubsub";
  # https://cloud.google.com/monitoring/api/resources#tag_pubsub_subscription).
  event_backlog_filter = join(" AND ", [
    "metric.type=\"pubsub.googleapis.com/subscription/oldest_unacked_message_age\"",
    "resource.type=\"pubsub_subscription\"",
    "resource.labels.subscription_id=starts_with(\"${local.trigger_subscription_prefix}\")",
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

# Opens an incident when an event of the trigger has waited longer than event_backlog_alert_seconds (default 10
# minutes) without being acknowledged: whatever holds it (deliveries refused before the function runs, a function that
# fails every delivery, a commit marker throttled behind a flood of chunk events), the operator hears of it within
# event_backlog_alert_seconds + ~3 minutes (one-minute samples, visible up to 2 minutes later), long before Eventarc
# discards the event 24 h after it was sent. Closes 30 minutes after the backlog is gone.
resource "google_monitoring_alert_policy" "event_backlog" {
  count = local.alerts ? 1 : 0

  project               = var.project_id
  display_name          = "${var.name_prefix}: checkpoint events are not being delivered"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = var.labels

  conditions {
    display_name = "oldest unacknowledged event of ${local.names.function}'s trigger"

    condition_threshold {
      filter          = local.event_backlog_filter
      comparison      = "COMPARISON_GT"
      threshold_value = var.event_backlog_alert_seconds
      duration        = "0s"

      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }

      trigger {
        count = 1
      }

      # An empty subscription may report nothing: not a problem.
      evaluation_missing_data = "EVALUATION_MISSING_DATA_INACTIVE"
    }
  }

  alert_strategy {
    auto_close = "1800s"
  }

  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      An event of the function `${local.names.function}`'s Eventarc trigger (project `${var.project_id}`) has waited more than ${var.event_backlog_alert_seconds} s without being acknowledged: a Cloud Storage event, possibly a commit marker, is not reaching the function or keeps failing there. Eventarc retries it with backoff (10 s to 600 s) and discards it 24 hours after it was sent.

      - The function's own lines first: an ERROR line of `${local.names.function}` says why it failed a delivery (the other alert, "a checkpoint event was dropped", explains each).
      - No line of the function's: the delivery is refused before the function runs. In the function's Cloud Run service `${local.names.function}` look at the request log: 429 (every instance busy: raise `function_max_instances`, or give the converted checkpoints their own `destination_bucket` so that their objects are no events), 403 (the trigger's account `${local.names.trigger_sa}` lacks `roles/run.invoker`, or IAM is still propagating after an apply), 5xx (the instance crashed: its start-up lines).
      - Once deliveries succeed, the backlog drains by itself. Steps whose events were discarded meanwhile: `orbax2reg cloud backfill <checkpoint-root>` starts every committed step that has no conversion.
    EOT
  }

  depends_on = [google_project_service.required]
}
