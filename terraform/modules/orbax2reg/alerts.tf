# Failure alerts, only when notification_channels names at least one channel (none by default: nothing is created).
# Three policies (one entry each of alert_policies below), so that whatever way a committed step fails to be converted,
# an operator hears of it:
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

  # The policies, one google_monitoring_alert_policy.pipeline each, titled "<name_prefix>: <title>". A policy has one
  # condition, named `condition`, of one of two kinds:
  # - `threshold`: any point of a time series of monitoring.tf (`series`), aligned by `aligner` over `period`, above
  #   `above`; no data is no problem (no failures, an empty subscription report nothing);
  # - `log_match`: a Logging query, matched by every line as it arrives (a log-match condition:
  #   https://cloud.google.com/logging/docs/alerting/log-based-alerts); at most one notification per 5 minutes (a rate
  #   limit is "required for alert policies with a LogMatch condition":
  #   https://cloud.google.com/python/docs/reference/monitoring/latest/google.cloud.monitoring_v3.types.AlertPolicy.AlertStrategy).
  # Every incident closes by itself 30 minutes after the condition last held. `documentation` is the notification's text.
  alert_policies = merge({
    # (1) Any conversion or export failed in the last 5 minutes: an export that fails raises in workflows/convert.yaml,
    # so its execution ends FAILED as a conversion's does.
    conversion_failed = {
      title     = "a conversion or export failed"
      condition = "failed executions of ${local.names.workflow}"
      threshold = { series = "failed_executions", above = 0, aligner = "ALIGN_SUM", period = "300s" }

      documentation = <<-EOT
        An execution of the `${local.names.workflow}` workflow (one orbax2reg conversion of a step, its Hugging Face export, or both) failed in project `${var.project_id}`, region `${var.region}`; what failed was not committed (no `index` for a conversion, no `model.safetensors.index.json` for an export).

        - Which one and why: `orbax2reg cloud status`, or the workflow's executions in the console (the error names the phase and group, from the jobs' failure reports; an export's on its own `export` line).
        - The job logs: Cloud Run jobs `${local.names.plan_job}`, `${local.names.group_job}`, `${local.names.finalize_job}`${local.export_on ? ", and the export job `${local.names.export_job}`" : ""}.
        - To run the step again: `orbax2reg cloud start` with the same source and destination (finished objects are skipped); an export alone: `orbax2reg cloud start --export <folder> --export-only`, or `orbax2reg cloud backfill --export`.
      EOT
    }

    # (2) The first ERROR line of the function: an event that will never start a conversion. The framework's own stack
    # trace after a retryable failure is not matched: that event is redelivered, not dropped.
    event_dropped = {
      title     = "a checkpoint event was dropped"
      condition = "ERROR lines of ${local.names.function}"
      log_match = join(" AND ", concat(local.monitored_terms.function, ["jsonPayload.component=\"orbax2reg-trigger\"", "severity>=ERROR"]))

      documentation = <<-EOT
        The function `${local.names.function}` (project `${var.project_id}`) dropped a Cloud Storage event, or has been failing to handle one for long: a committed step may not be converted. Its ERROR line says which:

        - `the workflow refused to start: ...`: the Workflows API refused the execution (a bad argument, a deleted workflow). Fix the cause, then `orbax2reg cloud start` the step.
        - `misconfigured, events are acknowledged and ignored until redeployed: ...`: an environment variable of the function is wrong; every event is dropped until `terraform apply` redeploys it. Then `orbax2reg cloud backfill` the steps committed meanwhile.
        - `... still failing ... after ...`: a delivery has been retried for that long (a claim that stays busy, an API that keeps failing); Eventarc drops the event 24 hours after it was sent. See the line's `errorKind` and the function's other lines.
        - any other ERROR line: the event or what it names was rejected for good (`errorKind`, `retryable: false`).

        `orbax2reg cloud status` lists the steps and their executions.
      EOT
    }

    # (3) An event of the trigger has waited longer than event_backlog_alert_seconds (default 10 minutes) without being
    # acknowledged: whatever holds it (deliveries refused before the function runs, a function that fails every
    # delivery, a commit marker throttled behind a flood of chunk events), the operator hears of it within
    # event_backlog_alert_seconds + ~3 minutes (one-minute samples, visible up to 2 minutes later), long before Eventarc
    # discards the event 24 h after it was sent.
    event_backlog = {
      title     = "checkpoint events are not being delivered"
      condition = "oldest unacknowledged event of ${local.names.function}'s trigger"
      threshold = { series = "backlog_age", above = var.event_backlog_alert_seconds, aligner = "ALIGN_MAX", period = "60s" }

      documentation = <<-EOT
        An event of the function `${local.names.function}`'s Eventarc trigger (project `${var.project_id}`) has waited more than ${var.event_backlog_alert_seconds} s without being acknowledged: a Cloud Storage event, possibly a commit marker, is not reaching the function or keeps failing there. Eventarc retries it with backoff (10 s to 600 s) and discards it 24 hours after it was sent.

        - The function's own lines first: an ERROR line of `${local.names.function}` says why it failed a delivery (the other alert, "a checkpoint event was dropped", explains each).
        - No line of the function's: the delivery is refused before the function runs. In the function's Cloud Run service `${local.names.function}` look at the request log: 429 (every instance busy: raise `function_max_instances`, or give the converted checkpoints their own `destination_bucket` so that their objects are no events), 403 (the trigger's account `${local.names.trigger_sa}` lacks `roles/run.invoker`, or IAM is still propagating after an apply), 5xx (the instance crashed: its start-up lines).
        - Once deliveries succeed, the backlog drains by itself. Steps whose events were discarded meanwhile: `orbax2reg cloud backfill <checkpoint-root>` starts every committed step that has no conversion.
      EOT
    }
    },
    # (4) With hf_export: an export task failed for good (its ERROR line says permanent: the input or the settings are
    # wrong, no retry can help). Matched as the line arrives, so the notification carries the export job's own line
    # (the file, key or field at fault), which (1) only counts. Log query: https://cloud.google.com/logging/docs/view/logging-query-language;
    # the job logs `permanent` as a JSON boolean, which makes jsonPayload.permanent a bool field ("Types of log fields"),
    # and a bool field is compared with the string "true" or "false" ("Values and conversions": a bool's permitted
    # query values are "True" or "false" in any letter case, e.g. "true"; the value is converted to the field's type).
    # A log-match condition's filter is such a query
    # (https://cloud.google.com/dotnet/docs/reference/Google.Cloud.Monitoring.V3/latest/Google.Cloud.Monitoring.V3.AlertPolicy.Types.Condition.Types.LogMatch).
    { for k, p in {
      export_failed = {
        title     = "a Hugging Face export failed for good"
        condition = "permanent ERROR lines of ${local.names.export_job}"
        log_match = join(" AND ", concat(local.monitored_terms.export_job, ["jsonPayload.component=\"orbax2reg-job\"", "severity>=ERROR", "jsonPayload.permanent=\"true\""]))

        documentation = <<-EOT
          A task of the export job `${local.names.export_job}` (project `${var.project_id}`) failed permanently: the step's Orbax source, the export's settings (hf_export) or its folder is wrong, and retrying cannot help. Its workflow execution fails too ("a conversion or export failed"); the export's folder has no `model.safetensors.index.json`, so it is not a complete export.

          - The line names the file, key or field at fault (`phase`: export-begin plans, export-shards writes, export-finalize checks the shards and commits).
          - `orbax2reg cloud status <checkpoint-root>` shows the step's export as failed, with the same line.
          - Once fixed: `orbax2reg cloud start <step> --export <folder> --export-only`, or `orbax2reg cloud backfill <checkpoint-root> --export` for every step hf_export asks for that has no export.
        EOT
      }
    } : k => p if local.export_on },
  )
}

resource "google_monitoring_alert_policy" "pipeline" {
  # A policy without one of the two condition kinds has it null.
  for_each = { for k, p in local.alert_policies : k => merge({ threshold = null, log_match = null }, p) if local.alerts }

  project               = var.project_id
  display_name          = "${var.name_prefix}: ${each.value.title}"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = var.labels

  conditions {
    display_name = each.value.condition

    dynamic "condition_threshold" {
      for_each = each.value.threshold[*]
      content {
        filter          = local.series_filters[condition_threshold.value.series]
        comparison      = "COMPARISON_GT"
        threshold_value = condition_threshold.value.above
        duration        = "0s"

        aggregations {
          alignment_period   = condition_threshold.value.period
          per_series_aligner = condition_threshold.value.aligner
        }

        trigger {
          count = 1
        }

        evaluation_missing_data = "EVALUATION_MISSING_DATA_INACTIVE"
      }
    }

    dynamic "condition_matched_log" {
      for_each = each.value.log_match[*]
      content {
        filter = condition_matched_log.value
      }
    }
  }

  alert_strategy {
    dynamic "notification_rate_limit" {
      for_each = each.value.log_match[*]
      content {
        period = "300s"
      }
    }
    auto_close = "1800s"
  }

  documentation {
    mime_type = "text/markdown"
    content   = each.value.documentation
  }

  depends_on = [google_project_service.required]
}

# The policies were three resources of their own (count = 0 or 1) before: a later apply moves them, not replaces them
# (https://developer.hashicorp.com/terraform/language/modules/develop/refactoring).
moved {
  from = google_monitoring_alert_policy.conversion_failed[0]
  to   = google_monitoring_alert_policy.pipeline["conversion_failed"]
}
moved {
  from = google_monitoring_alert_policy.event_dropped[0]
  to   = google_monitoring_alert_policy.pipeline["event_dropped"]
}
moved {
  from = google_monitoring_alert_policy.event_backlog[0]
  to   = google_monitoring_alert_policy.pipeline["event_backlog"]
}
