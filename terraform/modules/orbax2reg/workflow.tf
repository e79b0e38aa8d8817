locals {
  # The definition lives at the repository's top level (workflows/convert.yaml), next to the code it drives.
  workflow_source_path = var.workflow_source_path != null ? var.workflow_source_path : "${path.module}/../../../workflows/convert.yaml"
}

# The conversion workflow: plan -> convert-group per group (parallel, bounded) -> finalize, with events.
# file(), not templatefile(): the YAML is deployed byte for byte, so its own ${...} expressions need no $${...}
# escaping; everything deployment-specific reaches it through user_env_vars (sys.get_env).
resource "google_workflows_workflow" "convert" {
  project         = var.project_id
  name            = local.names.workflow
  region          = var.region
  description     = "orbax2reg: convert one Orbax checkpoint step into an AXLearn regular checkpoint"
  service_account = google_service_account.workflow.id
  call_log_level  = var.workflow_call_log_level
  labels          = var.labels

  source_contents = file(local.workflow_source_path)

  user_env_vars = {
    ORBAX2REG_PROJECT      = var.project_id
    ORBAX2REG_REGION       = var.region
    ORBAX2REG_PLAN_JOB     = google_cloud_run_v2_job.phase["plan"].name
    ORBAX2REG_GROUP_JOB    = google_cloud_run_v2_job.phase["convert-group"].name
    ORBAX2REG_FINALIZE_JOB = google_cloud_run_v2_job.phase["finalize"].name
    # The export job's name, which exists only with hf_export (an export asked for without it fails at its first
    # jobs.run, 404); named, not referenced, so that the setting is the same with the export on or off.
    ORBAX2REG_EXPORT_JOB          = local.names.export_job
    ORBAX2REG_EVENTS_TOPIC        = google_pubsub_topic.events.id
    ORBAX2REG_MAX_PARALLEL_GROUPS = tostring(var.max_parallel_groups)
    ORBAX2REG_GROUPS              = tostring(var.groups)
    ORBAX2REG_JOB_TIMEOUT         = tostring(local.job_timeout_seconds)
  }

  deletion_protection = var.deletion_protection

  depends_on = [google_project_service.required]

  lifecycle {
    precondition {
      condition     = local.job_wait_fits
      error_message = "task_timeout x (max_retries + 1) exceeds the 7 days workflows/convert.yaml waits for one job execution: lower task_timeout or max_retries."
    }
  }
}
