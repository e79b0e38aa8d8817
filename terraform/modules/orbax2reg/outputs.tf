output "function_name" {
  description = "Name of the Cloud Function (2nd gen) triggered by the checkpoint bucket."
  value       = google_cloudfunctions2_function.on_checkpoint.name
}

output "function_id" {
  description = "Full resource id of the function (projects/<p>/locations/<r>/functions/<name>)."
  value       = google_cloudfunctions2_function.on_checkpoint.id
}

output "workflow_id" {
  description = "Full id of the conversion workflow (projects/<p>/locations/<r>/workflows/<name>): the parent for createExecution, as the function receives it in ORBAX2REG_WORKFLOW."
  value       = google_workflows_workflow.convert.id
}

output "workflow_name" {
  description = "Short name of the conversion workflow."
  value       = google_workflows_workflow.convert.name
}

output "plan_job_name" {
  description = "Name of the plan Cloud Run job (the workflow's ORBAX2REG_PLAN_JOB)."
  value       = google_cloud_run_v2_job.phase["plan"].name
}

output "group_job_name" {
  description = "Name of the convert-group Cloud Run job (the workflow's ORBAX2REG_GROUP_JOB)."
  value       = google_cloud_run_v2_job.phase["convert-group"].name
}

output "finalize_job_name" {
  description = "Name of the finalize Cloud Run job (the workflow's ORBAX2REG_FINALIZE_JOB)."
  value       = google_cloud_run_v2_job.phase["finalize"].name
}

output "job_ids" {
  description = "Full ids of the three jobs by phase (projects/<p>/locations/<r>/jobs/<name>)."
  value = {
    plan            = google_cloud_run_v2_job.phase["plan"].id
    "convert-group" = google_cloud_run_v2_job.phase["convert-group"].id
    finalize        = google_cloud_run_v2_job.phase["finalize"].id
  }
}

output "events_topic_id" {
  description = "Full id of the events topic (projects/<p>/topics/<name>), as ORBAX2REG_EVENTS_TOPIC carries it."
  value       = google_pubsub_topic.events.id
}

output "events_topic_name" {
  description = "Short name of the events topic."
  value       = google_pubsub_topic.events.name
}

output "function_service_account_email" {
  description = "Runtime service account of the function."
  value       = google_service_account.function.email
}

output "trigger_service_account_email" {
  description = "Service account the Eventarc trigger delivers events as."
  value       = google_service_account.trigger.email
}

output "workflow_service_account_email" {
  description = "Service account the workflow runs as."
  value       = google_service_account.workflow.email
}

output "jobs_service_account_email" {
  description = "Runtime service account of the three Cloud Run jobs."
  value       = google_service_account.jobs.email
}

output "artifact_repository_url" {
  description = "Docker registry URL of the jobs' Artifact Registry repository (<region>-docker.pkg.dev/<project>/<repository>); the module's build pushes orbax2reg:<identity> there."
  value       = google_artifact_registry_repository.docker["images"].registry_uri
}

output "image" {
  description = "Image the three jobs run: orbax2reg:<the identity of its sources> as the module built it, or the pinned image given."
  value       = local.image
}

output "sources_bucket" {
  description = "The module's bucket for what it builds from: the function's source archive and the image's build contexts."
  value       = google_storage_bucket.sources.name
}

output "function_source" {
  description = "The function's source archive as gs://<bucket>/<object> (orbax2reg/function-<identity>.zip unless a prebuilt object was given)."
  value       = "gs://${local.function_source_bucket}/${local.function_source_object}"
}

output "image_build_service_account" {
  description = "Service account the image's Cloud Build run uses (projects/<p>/serviceAccounts/<email>), or null when image is pinned. Whoever applies needs Service Account User on it."
  value       = var.image == null ? local.image_build_service_account : null
}

output "destination_bucket" {
  description = "Bucket the regular checkpoints are written to (and the jobs may write)."
  value       = local.destination_bucket
}

output "destination_template" {
  description = "Where a converted step goes: the destination root template, with {bucket}, {root} and {step} (ORBAX2REG_DESTINATION_TEMPLATE)."
  value       = var.destination_template
}

output "hf_export_destination_template" {
  description = "Where a step's Hugging Face export goes (hf_export.destination_template, {bucket}, {root}, {step}), or null when hf_export is off; `orbax2reg cloud check` exports its fuji example there for its own root."
  value       = var.hf_export == null ? null : var.hf_export.destination_template
}

output "groups" {
  description = "Number of groups a checkpoint is split into (ORBAX2REG_GROUPS)."
  value       = var.groups
}

output "fan_out" {
  description = "What one conversion runs at once: max_parallel_groups convert-group executions of group_cpu vCPU and group_memory each, and the function at its bound (function_max_instances x function_cpu / function_memory); `orbax2reg cloud check` weighs it against the region's Cloud Run quota."
  value = {
    max_parallel_groups = var.max_parallel_groups
    group_cpu           = var.group_cpu
    group_memory        = var.group_memory
    # The function is a Cloud Run service in the same region: at its bound it uses the same quota.
    function_max_instances = var.function_max_instances
    function_cpu           = var.function_cpu
    function_memory        = var.function_memory
  }
}

output "claim_lease_seconds" {
  description = "How long a step's claim that names no execution protects it (the function's ORBAX2REG_CLAIM_LEASE_SECONDS)."
  value       = var.function_timeout_seconds + 60
}

output "trigger_region" {
  description = "Region of the function's Eventarc trigger (the checkpoint bucket's location)."
  value       = local.trigger_region
}

output "build_service_account" {
  description = "Service account the function's Cloud Build runs as (projects/<p>/serviceAccounts/<email>): function_build_service_account, or the <name_prefix>-build account the module created. Whoever applies needs Service Account User on it."
  value       = local.build_service_account
}

output "function_build_repository_id" {
  description = "Artifact Registry repository the function's build pushes its image to (projects/<p>/locations/<r>/repositories/<name>)."
  value       = google_artifact_registry_repository.docker["function_builds"].id
}

output "event_trigger" {
  description = "Full name of the function's Eventarc trigger (projects/<p>/locations/<region>/triggers/<id>), as the function's event_trigger reports it; `orbax2reg cloud check` reads the trigger's age and its subscription's acknowledgement deadline."
  value       = google_cloudfunctions2_function.on_checkpoint.event_trigger[0].trigger
}

output "trigger_subscription_prefix" {
  description = "How the Pub/Sub subscription Eventarc created for the trigger is named: eventarc-<region>-<trigger id>-sub- followed by a number (the subscription holds every event not yet acknowledged; the event_backlog alert and the dashboard select it by this prefix; Google promises only eventarc-<region>-, and `orbax2reg cloud check` fails when the subscription does not match)."
  value       = local.trigger_subscription_prefix
}

output "dashboard" {
  description = "Full id of the Cloud Monitoring dashboard (projects/<number>/dashboards/<id>), when dashboard = true; null otherwise."
  value       = one(google_monitoring_dashboard.pipeline[*].id)
}
