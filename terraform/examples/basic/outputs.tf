output "function_name" {
  description = "Cloud Function triggered by the checkpoint bucket."
  value       = module.orbax2reg.function_name
}

output "workflow_id" {
  description = "Full id of the conversion workflow."
  value       = module.orbax2reg.workflow_id
}

output "job_names" {
  description = "The plan, convert-group and finalize Cloud Run jobs."
  value = {
    plan            = module.orbax2reg.plan_job_name
    "convert-group" = module.orbax2reg.group_job_name
    finalize        = module.orbax2reg.finalize_job_name
  }
}

output "destination_template" {
  description = "Destination root template of the converted steps ({bucket}, {root}, {step}); the CLI reads it."
  value       = module.orbax2reg.destination_template
}

output "hf_export_destination_template" {
  description = "Where a step's Hugging Face export goes, or null without hf_export; `orbax2reg cloud check` reads it."
  value       = module.orbax2reg.hf_export_destination_template
}

output "groups" {
  description = "Number of groups a checkpoint is split into; the CLI reads it."
  value       = module.orbax2reg.groups
}

output "fan_out" {
  description = "Convert-group executions at once and the size of each; `orbax2reg cloud check` reads it."
  value       = module.orbax2reg.fan_out
}

output "claim_lease_seconds" {
  description = "The function's claim lease in seconds; the CLI reads it."
  value       = module.orbax2reg.claim_lease_seconds
}

output "events_topic_id" {
  description = "Pub/Sub topic with the pipeline's events; subscribe to it to follow conversions."
  value       = module.orbax2reg.events_topic_id
}

output "service_account_emails" {
  description = "The service accounts the pipeline runs as, by component (the function's build account as projects/<p>/serviceAccounts/<email>)."
  value = {
    function = module.orbax2reg.function_service_account_email
    trigger  = module.orbax2reg.trigger_service_account_email
    workflow = module.orbax2reg.workflow_service_account_email
    jobs     = module.orbax2reg.jobs_service_account_email
    build    = module.orbax2reg.build_service_account
  }
}

output "artifact_repository_url" {
  description = "The jobs' image repository; the module's build pushes orbax2reg:<identity of its sources> there."
  value       = module.orbax2reg.artifact_repository_url
}

output "image" {
  description = "Image the jobs run (built by the module from the repository, tagged with its sources' identity)."
  value       = module.orbax2reg.image
}

output "function_source" {
  description = "The function's source archive the module uploaded (named by its content)."
  value       = module.orbax2reg.function_source
}

output "event_trigger" {
  description = "The function's Eventarc trigger; `orbax2reg cloud check` reads its age and its subscription's acknowledgement deadline."
  value       = module.orbax2reg.event_trigger
}

output "destination_bucket" {
  description = "Bucket the regular checkpoints are written to."
  value       = module.orbax2reg.destination_bucket
}
