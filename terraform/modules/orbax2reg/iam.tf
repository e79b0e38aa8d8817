# Four dedicated service accounts, each granted only what its component does, at the narrowest scope the role
# can be granted on (bucket, topic, job, service, service account; project only where no smaller scope exists).
# The table in terraform/README.md lists every binding below with its reason; test/terraform checks they match.

# ---------------------------------------------------------------------------------------------------------------------
# Service accounts
# ---------------------------------------------------------------------------------------------------------------------

resource "google_service_account" "function" {
  project      = var.project_id
  account_id   = local.names.function_sa
  display_name = "orbax2reg function runtime"
  description  = "Runs the Cloud Function that starts a conversion workflow when an Orbax step is committed."

  depends_on = [google_project_service.required]
}

resource "google_service_account" "trigger" {
  project      = var.project_id
  account_id   = local.names.trigger_sa
  display_name = "orbax2reg Eventarc trigger"
  description  = "Identity Eventarc uses to deliver Cloud Storage events to the function."

  depends_on = [google_project_service.required]
}

resource "google_service_account" "workflow" {
  project      = var.project_id
  account_id   = local.names.workflow_sa
  display_name = "orbax2reg workflow"
  description  = "Runs the conversion workflow: executes the plan, convert-group and finalize jobs with overrides."

  depends_on = [google_project_service.required]
}

resource "google_service_account" "jobs" {
  project      = var.project_id
  account_id   = local.names.jobs_sa
  display_name = "orbax2reg jobs"
  description  = "Runtime identity of the plan, convert-group and finalize Cloud Run jobs."

  depends_on = [google_project_service.required]
}

# ---------------------------------------------------------------------------------------------------------------------
# Cloud Storage service agent: publishes the bucket's events to the Pub/Sub transport topic Eventarc creates.
# That topic is made by Eventarc and unknown here, hence the project scope.
# ---------------------------------------------------------------------------------------------------------------------

data "google_storage_project_service_account" "gcs" {
  project = var.project_id

  depends_on = [google_project_service.required]
}

resource "google_project_iam_member" "gcs_agent_pubsub_publisher" {
  project = var.project_id
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${data.google_storage_project_service_account.gcs.email_address}"
}

# ---------------------------------------------------------------------------------------------------------------------
# Trigger service account
# ---------------------------------------------------------------------------------------------------------------------

# Receive events from Eventarc (only grantable on the project).
resource "google_project_iam_member" "trigger_event_receiver" {
  project = var.project_id
  role    = "roles/eventarc.eventReceiver"
  member  = "serviceAccount:${google_service_account.trigger.email}"
}

# Invoke the function, scoped to the function's own Cloud Run service (what `gcloud functions
# add-invoker-policy-binding` grants), not to every service and job in the project.
resource "google_cloud_run_v2_service_iam_member" "trigger_invokes_function" {
  project  = var.project_id
  location = var.region
  name     = google_cloudfunctions2_function.on_checkpoint.service_config[0].service
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.trigger.email}"
}

# ---------------------------------------------------------------------------------------------------------------------
# Function runtime service account
# ---------------------------------------------------------------------------------------------------------------------

# Create executions of the workflow. There is no workflow-level IAM resource (google_workflows_workflow has none),
# so this is project scope.
resource "google_project_iam_member" "function_workflows_invoker" {
  project = var.project_id
  role    = "roles/workflows.invoker"
  member  = "serviceAccount:${google_service_account.function.email}"
}

# Publish conversion.requested events (docs/events.md).
resource "google_pubsub_topic_iam_member" "function_events_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.events.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${google_service_account.function.email}"
}

# Emergency-checkpointer steps commit in two halves (tensors/step_X/commit_success.txt, non-tensors/step_X/index);
# the function checks that the other half exists (object metadata get) before converting.
resource "google_storage_bucket_iam_member" "function_checkpoint_object_viewer" {
  bucket = var.checkpoint_bucket
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.function.email}"
}

# Claim a step exactly once: <destination>/step_XXXXXXXX/.orbax2reg/claim.json is created only if absent
# (ifGenerationMatch=0), rewritten with the execution name, deleted again if starting the workflow fails.
# objectUser = create/read/overwrite/delete objects, without objectAdmin's object-ACL rights.
resource "google_storage_bucket_iam_member" "function_destination_object_user" {
  bucket = local.destination_bucket
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.function.email}"
}

# ---------------------------------------------------------------------------------------------------------------------
# Workflow service account
# ---------------------------------------------------------------------------------------------------------------------

# Run the three jobs with container overrides (args/env/taskCount per execution) and poll their executions.
# roles/run.developer is what Cloud Run documents for "execute with overrides"; granted on each job only, so the
# workflow cannot touch any other Cloud Run resource. (A custom role with run.jobs.run + run.jobs.runWithOverrides
# would be narrower still, but needs iam.roleAdmin to deploy and does not obviously cover polling the execution.)
resource "google_cloud_run_v2_job_iam_member" "workflow_runs_jobs" {
  for_each = {
    plan            = google_cloud_run_v2_job.plan.name
    "convert-group" = google_cloud_run_v2_job.convert_group.name
    finalize        = google_cloud_run_v2_job.finalize.name
  }

  project  = var.project_id
  location = var.region
  name     = each.value
  role     = "roles/run.developer"
  member   = "serviceAccount:${google_service_account.workflow.email}"
}

# Executions run as the jobs' service account; act as it when starting them with overrides.
resource "google_service_account_iam_member" "workflow_acts_as_jobs" {
  service_account_id = google_service_account.jobs.name
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.workflow.email}"
}

# Read the plan (group list) the plan job writes under the destination.
resource "google_storage_bucket_iam_member" "workflow_destination_object_viewer" {
  bucket = local.destination_bucket
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.workflow.email}"
}

# Publish conversion.succeeded / conversion.failed events.
resource "google_pubsub_topic_iam_member" "workflow_events_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.events.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${google_service_account.workflow.email}"
}

# sys.log and call logging (only grantable on the project).
resource "google_project_iam_member" "workflow_log_writer" {
  project = var.project_id
  role    = "roles/logging.logWriter"
  member  = "serviceAccount:${google_service_account.workflow.email}"
}

# ---------------------------------------------------------------------------------------------------------------------
# Jobs service account
# ---------------------------------------------------------------------------------------------------------------------

# Read the Orbax checkpoints.
resource "google_storage_bucket_iam_member" "jobs_checkpoint_object_viewer" {
  bucket = var.checkpoint_bucket
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.jobs.email}"
}

# Write, overwrite (resume, --force) and delete (leftovers) objects of the regular checkpoints.
resource "google_storage_bucket_iam_member" "jobs_destination_object_admin" {
  bucket = local.destination_bucket
  role   = "roles/storage.objectAdmin"
  member = "serviceAccount:${google_service_account.jobs.email}"

  lifecycle {
    precondition {
      condition     = local.destination_matches_template
      error_message = "destination_template writes to bucket \"${local.template_bucket}\" but destination_bucket is \"${local.destination_bucket}\": set destination_bucket to the template's bucket (or leave it null with a gs://{bucket}/... template)."
    }
  }
}
