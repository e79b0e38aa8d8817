# What the failure alerts (alerts.tf) and the dashboard (dashboard.tf) read, each defined once: this deployment's
# monitored resources, the time series read on them, and the log-based metrics made from the pipeline's own JSON lines.
# A new metric is one entry: in `log_metrics` (a log-based metric: created with the dashboard, and a time series of its
# own) or in `series` (one of Google's built-in metrics); a chart or an alert then names it by its key.
#
# Filters are in the Monitoring filter syntax (https://cloud.google.com/monitoring/api/v3/filters), starts_with() and
# monitoring.regex.full_match() included; a log-based metric's filter is a Logging query
# (https://cloud.google.com/logging/docs/view/logging-query-language), where a resource's type and labels are written
# the same way.

locals {
  # This deployment's monitored resources (https://cloud.google.com/monitoring/api/resources): their type, and the terms
  # on their labels that select this deployment's. Cloud Run job logs and metrics are on cloud_run_job, labelled with
  # job_name; a 2nd-gen function's on the Cloud Run service it runs as, cloud_run_revision, labelled with service_name
  # (https://cloud.google.com/run/docs/logging). The trigger's subscription is selected by its name's prefix (alerts.tf
  # says why).
  monitored = {
    workflow             = { type = "workflows.googleapis.com/Workflow", labels = ["workflow_id=\"${local.names.workflow}\"", "location=\"${var.region}\""] }
    function             = { type = "cloud_run_revision", labels = ["service_name=\"${local.names.function}\""] }
    plan_job             = { type = "cloud_run_job", labels = ["job_name=\"${local.names.plan_job}\""] }
    finalize_job         = { type = "cloud_run_job", labels = ["job_name=\"${local.names.finalize_job}\""] }
    jobs                 = { type = "cloud_run_job", labels = ["job_name=monitoring.regex.full_match(\"${var.name_prefix}-(plan|convert-group|finalize)\")"] }
    export_job           = { type = "cloud_run_job", labels = ["job_name=\"${local.names.export_job}\""] }
    trigger_subscription = { type = "pubsub_subscription", labels = ["subscription_id=starts_with(\"${local.trigger_subscription_prefix}\")"] }
    destination_bucket   = { type = "gcs_bucket", labels = ["bucket_name=\"${local.destination_bucket}\""] }
  }
  monitored_terms = {
    for k, r in local.monitored : k => concat(["resource.type=\"${r.type}\""], [for l in r.labels : "resource.labels.${l}"])
  }

  # The log-based metrics (https://cloud.google.com/logging/docs/logs-based-metrics), one google_logging_metric each
  # (dashboard.tf), named <name_prefix>/<key>; the metric type is logging.googleapis.com/user/<name>. Each counts the
  # lines of `component` on the resource `on` whose message is one of `messages`; a DISTRIBUTION takes its values from
  # the line with `value_extractor`, into `exponential_buckets`.
  log_metrics = merge({
    # One per conversion planned: every execution of the workflow runs the plan job once (a retried plan job, or an
    # execution resumed by hand, plans again), and it logs exactly one of these lines when it has planned
    # (src/cloud/job/phases.ts).
    conversions_started = {
      on         = "plan_job"
      component  = "orbax2reg-job"
      messages   = ["plan written", "reusing existing plan", "already converted; nothing to do"]
      value_type = "INT64"
      unit       = "1"
    }
    # The finalize job's "checkpoint committed" line: conversionSeconds, from the plan to the index
    # (src/cloud/job/phases.ts). 30 exponential buckets from 1 s growing by 1.6, the last finite one ending at ~15 days
    # (a conversion waits at most 7 days for one job: workflow-argument.ts, MAX_JOB_TIMEOUT).
    conversion_seconds = {
      on                  = "finalize_job"
      component           = "orbax2reg-job"
      messages            = ["checkpoint committed"]
      value_type          = "DISTRIBUTION"
      unit                = "s"
      value_extractor     = "EXTRACT(jsonPayload.conversionSeconds)"
      exponential_buckets = { num_finite_buckets = 30, growth_factor = 1.6, scale = 1 }
    }
    # The function's "conversion started" line: a commit marker that started a conversion (src/cloud/trigger/handler.ts).
    trigger_starts = {
      on         = "function"
      component  = "orbax2reg-trigger"
      messages   = ["conversion started"]
      value_type = "INT64"
      unit       = "1"
    }
    },
    # The export job's lines (src/cloud/job/export-phases.ts), only with hf_export (no export job otherwise).
    { for k, m in {
      # One per export committed: export-finalize's "export committed" line, written once the index is (a rerun of an
      # export already committed logs it too, with alreadyExported true).
      exports_committed = {
        on         = "export_job"
        component  = "orbax2reg-job"
        messages   = ["export committed"]
        value_type = "INT64"
        unit       = "1"
      }
      # Each export-shards task's "shards written" line: mbPerSecond, the task's bytes written over its run time. 20
      # exponential buckets from 0.1 MB/s growing by 2, the last finite one ending at ~52 GB/s. A DISTRIBUTION needs
      # bucket_options (https://cloud.google.com/dotnet/docs/reference/Google.Cloud.Logging.V2/latest/Google.Cloud.Logging.V2.LogMetric).
      export_task_mb_per_second = {
        on                  = "export_job"
        component           = "orbax2reg-job"
        messages            = ["shards written"]
        value_type          = "DISTRIBUTION"
        unit                = "MBy/s"
        value_extractor     = "EXTRACT(jsonPayload.mbPerSecond)"
        exponential_buckets = { num_finite_buckets = 20, growth_factor = 2, scale = 0.1 }
      }
    } : k => m if local.export_on },
  )
  log_metric_names = { for k, m in local.log_metrics : k => "${var.name_prefix}/${k}" }
  log_metric_filters = {
    for k, m in local.log_metrics : k => join(" AND ", concat(local.monitored_terms[m.on], [
      "jsonPayload.component=\"${m.component}\"",
      length(m.messages) == 1 ? "jsonPayload.message=\"${m.messages[0]}\"" : "(${join(" OR ", [for message in m.messages : "jsonPayload.message=\"${message}\""])})",
    ]))
  }

  # The time series the alerts and the dashboard read: a metric, terms on its own labels, and the monitored resource it
  # is read on. Google's built-in metrics exist in every project from the start
  # (https://cloud.google.com/monitoring/api/metrics_gcp_p_z, sections "pubsub", "run", "storage", "workflows"; test/
  # terraform/dashboard.test.ts lists their kinds and labels); a log-based metric is read on its resource's type alone,
  # its name being this deployment's already.
  series = merge(
    {
      # workflows.googleapis.com/finished_execution_count (BETA, DELTA, INT64; label `status`, the execution's state).
      finished_executions = { metric = "workflows.googleapis.com/finished_execution_count", labels = [], on = local.monitored_terms.workflow }
      failed_executions   = { metric = "workflows.googleapis.com/finished_execution_count", labels = ["status=\"FAILED\""], on = local.monitored_terms.workflow }
      # pubsub.googleapis.com/subscription/oldest_unacked_message_age (GA; GAUGE, INT64, seconds; "Sampled every 60
      # seconds. After sampling, data is not visible for up to 120 seconds"), and num_undelivered_messages (GAUGE).
      backlog_age   = { metric = "pubsub.googleapis.com/subscription/oldest_unacked_message_age", labels = [], on = local.monitored_terms.trigger_subscription }
      backlog_count = { metric = "pubsub.googleapis.com/subscription/num_undelivered_messages", labels = [], on = local.monitored_terms.trigger_subscription }
      bytes_written = { metric = "storage.googleapis.com/network/received_bytes_count", labels = [], on = local.monitored_terms.destination_bucket }
      deliveries    = { metric = "run.googleapis.com/request_count", labels = [], on = local.monitored_terms.function }
      task_attempts = { metric = "run.googleapis.com/job/completed_task_attempt_count", labels = [], on = local.monitored_terms.jobs }
    },
    {
      for k, m in local.log_metrics : k => {
        metric = "logging.googleapis.com/user/${local.log_metric_names[k]}", labels = [], on = ["resource.type=\"${local.monitored[m.on].type}\""]
      }
    },
  )
  series_filters = {
    for k, s in local.series : k => join(" AND ", concat(["metric.type=\"${s.metric}\""], [for l in s.labels : "metric.labels.${l}"], s.on))
  }
}
