# Dedicated service accounts, each granted only what its component does, with the narrowest predefined role at the
# narrowest scope it can be granted on (job, topic, bucket, repository; project only where the resource the API checks
# is not one the module owns, each said below). Every grant cites the Google documentation it rests on.
# terraform/README.md lists every binding in its roles table; test/terraform/structure.test.ts checks they match.
#
# Role contents: https://cloud.google.com/iam/docs/roles-permissions/run, .../workflows, .../storage,
# .../pubsub, .../logging, .../artifactregistry (the "Lowest-level resources where you can grant this role" lines
# give the scopes).

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

# Cloud Build builds the function as this account (build_config.service_account), unless the caller names its own in
# function_build_service_account (then the module creates no account and grants it nothing). Projects created since
# July 2024 build with a default account that lacks the permissions to build a function:
# https://cloud.google.com/functions/docs/securing/build-custom-sa
resource "google_service_account" "build" {
  count = var.function_build_service_account == null ? 1 : 0

  project      = var.project_id
  account_id   = local.names.build_sa
  display_name = "orbax2reg function build"
  description  = "Cloud Build runs the trigger function's build as this account (logs, image push, source read)."

  depends_on = [google_project_service.required]
}

# The jobs' image is built by Cloud Build as this account (build.tf, gcloud builds submit --service-account), unless the
# caller names its own in image_build_service_account, or pins `image` (then nothing is built). Not the function's
# build account: that one runs the function's build and may push only the function's images; this one may push only
# the jobs' image, the one the jobs' account runs.
# https://cloud.google.com/build/docs/securing-builds/configure-user-specified-service-accounts
resource "google_service_account" "image_build" {
  count = local.image_build_account_created ? 1 : 0

  project      = var.project_id
  account_id   = local.names.image_build_sa
  display_name = "orbax2reg jobs' image build"
  description  = "Cloud Build runs the build of the jobs' image as this account (logs, image push, build context read)."

  depends_on = [google_project_service.required]
}

locals {
  image_build_account_created = var.image == null && var.image_build_service_account == null
  image_build_service_account = var.image_build_service_account != null ? var.image_build_service_account : one(google_service_account.image_build[*].id)
}

# The project number names two things below: the Pub/Sub service agent and the bucket Cloud Functions copies the
# function's source into (gcf-v2-sources-<number>-<region>). Read after the APIs are enabled (deferred to apply on a
# first deployment).
data "google_project" "this" {
  project_id = var.project_id

  depends_on = [terraform_data.apis_enabled]
}

# ---------------------------------------------------------------------------------------------------------------------
# Service agents
# ---------------------------------------------------------------------------------------------------------------------

data "google_storage_project_service_account" "gcs" {
  project = var.project_id

  depends_on = [terraform_data.apis_enabled]
}

# Cloud Storage events reach Eventarc through a Pub/Sub topic Eventarc creates; the Cloud Storage service agent
# publishes to it. That topic is made by Eventarc and unknown here, hence the project scope (as in Google's guide).
# https://cloud.google.com/eventarc/standard/docs/functions/roles-permissions
resource "google_project_iam_member" "gcs_agent_pubsub_publisher" {
  project = var.project_id
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${data.google_storage_project_service_account.gcs.email_address}"
}

# Opt-in (pubsub_agent_token_creator): projects whose Pub/Sub service agent was created on or before 8 April 2021
# need it to mint the tokens of Eventarc's authenticated push. Granted on the project, as the documentation does.
# https://cloud.google.com/eventarc/standard/docs/functions/roles-permissions
resource "google_project_iam_member" "pubsub_agent_token_creator" {
  count = var.pubsub_agent_token_creator ? 1 : 0

  project = var.project_id
  role    = "roles/iam.serviceAccountTokenCreator"
  member  = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
}

# ---------------------------------------------------------------------------------------------------------------------
# Trigger service account
# ---------------------------------------------------------------------------------------------------------------------

# Receive events from Eventarc; Eventarc Event Receiver can only be granted on the project.
# https://cloud.google.com/eventarc/standard/docs/functions/roles-permissions
resource "google_project_iam_member" "trigger_event_receiver" {
  project = var.project_id
  role    = "roles/eventarc.eventReceiver"
  member  = "serviceAccount:${google_service_account.trigger.email}"
}

# Invoke the function, scoped to the function's own Cloud Run service (what `gcloud functions
# add-invoker-policy-binding` grants), not to every service and job in the project.
# https://cloud.google.com/eventarc/standard/docs/functions/roles-permissions
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

# The function creates an execution of the workflow (workflows.executions.create) and looks executions up by label
# before starting one and after an error (workflows.executions.list, .get). Workflows Invoker is the one predefined
# role with all three (Workflows Viewer has list/get but not create, and reads the workflow's source too); Workflows
# roles can only be granted on the project (google_workflows_workflow has no IAM resource either).
# https://cloud.google.com/workflows/docs/access-control
resource "google_project_iam_member" "function_workflows_invoker" {
  project = var.project_id
  role    = "roles/workflows.invoker"
  member  = "serviceAccount:${google_service_account.function.email}"
}

# Publish conversion.requested events (docs/events.md).
# https://cloud.google.com/pubsub/docs/access-control
resource "google_pubsub_topic_iam_member" "function_events_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.events.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${google_service_account.function.email}"
}

# Read only: emergency-checkpointer steps commit in two halves (tensors/step_X/commit_success.txt,
# non-tensors/step_X/index); the function stats the other half before converting.
# https://cloud.google.com/storage/docs/access-control/iam-roles
resource "google_storage_bucket_iam_member" "function_checkpoint_object_viewer" {
  bucket = var.checkpoint_bucket
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.function.email}"
}

# Write its claims, and nothing else: <destination root>/step_XXXXXXXX/.orbax2reg/claim.json, created with
# ifGenerationMatch=0, read, rewritten with ifGenerationMatch=<generation>, deleted with ifGenerationMatch.
# Storage Object User (create, get, update, delete objects; no ACL or IAM rights) limited by an IAM condition to
# objects whose name ends with /.orbax2reg/claim.json. Cloud Storage evaluates resource.name as
# projects/_/buckets/BUCKET/objects/OBJECT and supports startsWith()/endsWith() on it; conditions need uniform
# bucket-level access on the bucket (checked below).
# https://cloud.google.com/storage/docs/access-control/iam (IAM Conditions)
# https://cloud.google.com/iam/docs/conditions-attribute-reference#resource-name
# https://cloud.google.com/iam/docs/conditions-resource-attributes#resource-name
resource "google_storage_bucket_iam_member" "function_destination_claims" {
  bucket = local.destination_bucket
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.function.email}"

  condition {
    title       = "orbax2reg claims only"
    description = "Objects named <destination>/step_XXXXXXXX/.orbax2reg/claim.json: the function's claim on a step."
    expression  = "resource.name.startsWith(\"projects/_/buckets/${local.destination_bucket}/objects/\") && resource.name.endsWith(\"/.orbax2reg/claim.json\")"
  }

  lifecycle {
    precondition {
      condition     = data.google_storage_bucket.destination.uniform_bucket_level_access
      error_message = "Bucket \"${local.destination_bucket}\" (the destination) must have uniform bucket-level access enabled: the function's claim grant is an IAM condition, which Cloud Storage only honours on such buckets (https://cloud.google.com/storage/docs/uniform-bucket-level-access)."
    }
  }
}

# The destination bucket, read for the uniform bucket-level access precondition above (deferred to apply on a first
# deployment, like the other data sources that wait for the APIs).
data "google_storage_bucket" "destination" {
  name = local.destination_bucket
  # Only fills the data source's `project` attribute; saves it a Compute API lookup.
  project = var.project_id

  depends_on = [terraform_data.apis_enabled]
}

# ---------------------------------------------------------------------------------------------------------------------
# Workflow service account
# ---------------------------------------------------------------------------------------------------------------------

# Run the three jobs with container overrides (args/env/taskCount per execution: run.jobs.run +
# run.jobs.runWithOverrides) and cancel their executions (run.executions.cancel, when the wait for one times out).
# Cloud Run Jobs Executor With Overrides "can execute and cancel Cloud Run jobs with overrides" and nothing else: no
# run.jobs.update, so the workflow cannot change a job's image and run code as the jobs' account, which
# roles/run.developer allowed. Granted on each job, not the project.
# https://cloud.google.com/iam/docs/roles-permissions/run#run.jobsExecutorWithOverrides
# https://cloud.google.com/run/docs/reference/rest/v2/projects.locations.jobs/run
resource "google_cloud_run_v2_job_iam_member" "workflow_runs_jobs" {
  # With hf_export, the export job too (its phase is an args override: the same role covers it).
  for_each = { for phase, job in google_cloud_run_v2_job.phase : phase => job.name }

  project  = var.project_id
  location = var.region
  name     = each.value
  role     = "roles/run.jobsExecutorWithOverrides"
  member   = "serviceAccount:${google_service_account.workflow.email}"
}

# jobs.run returns a long-running operation, which the Run v2 connector polls (or the workflow itself, with
# googleapis.run.v2.projects.locations.operations.get) until the execution ends: run.operations.get on
# projects/P/locations/L/operations/ID, a project-level name no job-level grant covers. The workflow may also read
# an execution (...jobs.executions.get: run.executions.get). Cloud Run Viewer is the narrowest
# predefined role with run.operations.get; read-only, it adds no way to run, change or invoke anything.
# https://cloud.google.com/run/docs/reference/rest/v2/projects.locations.operations/get
# https://cloud.google.com/iam/docs/roles-permissions/run#run.viewer
# https://cloud.google.com/workflows/docs/connectors#long-running_operations
resource "google_project_iam_member" "workflow_run_viewer" {
  project = var.project_id
  role    = "roles/run.viewer"
  member  = "serviceAccount:${google_service_account.workflow.email}"
}

# No roles/iam.serviceAccountUser on the jobs' account: executing a job, with or without overrides, needs only
# run.jobs.run / run.jobs.runWithOverrides on the job (the overrides cannot change the service account); actAs is
# needed to deploy a job with a service account, which the workflow never does.
# https://cloud.google.com/run/docs/reference/rest/v1/namespaces.jobs/run
# https://cloud.google.com/run/docs/configuring/jobs/service-identity

# Read what the jobs report: the plan job's answer (<destination>/.orbax2reg/executions/<id>/plan.json) and a failed
# job's failures/<attempt>/ reports (listed, then read).
# https://cloud.google.com/storage/docs/access-control/iam-roles
resource "google_storage_bucket_iam_member" "workflow_destination_object_viewer" {
  bucket = local.destination_bucket
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.workflow.email}"
}

# Publish conversion.succeeded / conversion.failed events.
# https://cloud.google.com/pubsub/docs/access-control
resource "google_pubsub_topic_iam_member" "workflow_events_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.events.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${google_service_account.workflow.email}"
}

# sys.log and call logging (Logs Writer is granted on the project).
# https://cloud.google.com/workflows/docs/log-workflow
# https://cloud.google.com/iam/docs/roles-permissions/logging
resource "google_project_iam_member" "workflow_log_writer" {
  project = var.project_id
  role    = "roles/logging.logWriter"
  member  = "serviceAccount:${google_service_account.workflow.email}"
}

# ---------------------------------------------------------------------------------------------------------------------
# Jobs service account
# ---------------------------------------------------------------------------------------------------------------------

# Read and list the Orbax checkpoints. Read only: no grant lets the jobs write, overwrite or delete a source object
# (test/terraform/cli.test.ts evaluates the write grant's condition on source and destination names). In the default
# single bucket this is also what lets the jobs list their destination: storage.objects.list is checked on the bucket
# (its resource.name is projects/_/buckets/BUCKET, which no object-name condition matches), so the conditional grant
# below gives no listing.
# https://cloud.google.com/storage/docs/access-control/iam-roles
# https://cloud.google.com/storage/docs/access-control/iam-permissions (objects.list: permission on the bucket)
# https://cloud.google.com/iam/docs/conditions-resource-attributes#resource-name
resource "google_storage_bucket_iam_member" "jobs_checkpoint_object_viewer" {
  bucket = var.checkpoint_bucket
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.jobs.email}"
}

# A separate destination bucket is listed and read through a grant of its own, for the same reason.
# https://cloud.google.com/storage/docs/access-control/iam-roles
resource "google_storage_bucket_iam_member" "jobs_destination_object_viewer" {
  count = local.destination_apart ? 1 : 0

  bucket = local.destination_bucket
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.jobs.email}"
}

# Create, overwrite (resume, --force: overwriting needs storage.objects.delete too), read and delete (leftovers, and the
# finalize job's retention: keep_last_n / keep_every_n_steps delete older converted steps) the objects of the regular
# checkpoints, and only those: an IAM condition on resource.name (main.tf's jobs_write_condition) limits the grant to the
# destinations destination_template names. Storage Object User does all that without Storage Object Admin's rights on
# object ACLs (it holds storage.objects.delete: Google names it the role for deleting objects through the API); Storage
# Object Creator could neither overwrite nor delete. Predefined Cloud Storage roles granted on a bucket take
# conditions on resource.name, which Cloud Storage evaluates only on buckets with uniform bucket-level access.
# https://cloud.google.com/storage/docs/access-control/iam-roles
# https://cloud.google.com/storage/docs/deleting-objects
# https://cloud.google.com/storage/docs/access-control/iam#conditions
# https://cloud.google.com/iam/docs/conditions-attribute-reference#resource-name
# https://cloud.google.com/storage/docs/uniform-bucket-level-access
resource "google_storage_bucket_iam_member" "jobs_destination_object_user" {
  bucket = local.destination_bucket
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.jobs.email}"

  condition {
    title       = "orbax2reg destinations only"
    description = "The regular checkpoints destination_template names; never a source checkpoint."
    expression  = local.jobs_write_condition
  }

  lifecycle {
    precondition {
      condition     = local.destination_matches_template
      error_message = "destination_template writes to bucket \"${local.template_bucket}\" but destination_bucket is \"${local.destination_bucket}\": set destination_bucket to the template's bucket (or leave it null with a gs://{bucket}/... template)."
    }
    precondition {
      condition     = local.jobs_write_form != "none"
      error_message = "destination_template \"${var.destination_template}\" puts the regular checkpoints where no IAM condition can tell them from the source checkpoints in bucket \"${var.checkpoint_bucket}\": use gs://{bucket}/{root}/<dir>, gs://{bucket}/<dir>/{root}, or a separate destination_bucket."
    }
    precondition {
      condition     = data.google_storage_bucket.destination.uniform_bucket_level_access
      error_message = "Bucket \"${local.destination_bucket}\" (the destination) must have uniform bucket-level access enabled: the jobs' write grant is an IAM condition, which Cloud Storage only honours on such buckets (https://cloud.google.com/storage/docs/uniform-bucket-level-access)."
    }
  }
}

# With hf_export: create, overwrite and delete (resume, --force, the exports' retention) the objects of the exports'
# folders, and only those, as jobs_destination_object_user does for the regular checkpoints (main.tf:
# export_write_condition). Their bucket is the checkpoint bucket or destination_bucket, which the jobs already list
# and read (jobs_checkpoint_object_viewer, jobs_destination_object_viewer); a tokenizer file elsewhere needs a read
# grant of its own.
# https://cloud.google.com/storage/docs/access-control/iam-roles
# https://cloud.google.com/iam/docs/conditions-attribute-reference#resource-name
resource "google_storage_bucket_iam_member" "jobs_export_object_user" {
  count = local.export_on ? 1 : 0

  bucket = local.export_bucket
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.jobs.email}"

  condition {
    title       = "orbax2reg exports only"
    description = "The Hugging Face exports hf_export.destination_template names; never a source checkpoint."
    expression  = local.export_write_condition
  }

  lifecycle {
    precondition {
      condition     = local.export_bucket_known
      error_message = "hf_export.destination_template writes to bucket \"${local.export_bucket}\": it must be checkpoint_bucket or destination_bucket, which the jobs can list."
    }
    precondition {
      condition     = local.export_write_form != "none"
      error_message = "hf_export.destination_template \"${local.export_template}\" puts the exports where no IAM condition can tell them from the source checkpoints in bucket \"${var.checkpoint_bucket}\": use gs://{bucket}/{root}/<dir>/{step}, gs://{bucket}/<dir>/{root}/{step}, or destination_bucket."
    }
  }
}

# The finalize job announces each converted step its retention deletes (conversion.pruned), on the events topic only.
# https://cloud.google.com/pubsub/docs/access-control
resource "google_pubsub_topic_iam_member" "jobs_events_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.events.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${google_service_account.jobs.email}"
}

# ---------------------------------------------------------------------------------------------------------------------
# Build service account (only when the module creates it)
# ---------------------------------------------------------------------------------------------------------------------
# Google lists what a custom build service account needs: Logs Writer (build logs), Artifact Registry Writer (the
# built image) and Storage Object Admin ("for retrieving the function source from the Cloud Storage bucket, and to store
# build images"; the Cloud Functions page said Storage Object Viewer, which no test here can show to be enough). Each
# role is granted as listed, on no more than what the build touches: the project's logs, the function's build
# repository, the function's staged source.
# https://cloud.google.com/run/docs/configuring/services/build-service-account
# https://cloud.google.com/functions/docs/securing/build-custom-sa

# Store build logs in Cloud Logging (Logs Writer is granted on the project).
# https://cloud.google.com/functions/docs/securing/build-custom-sa
resource "google_project_iam_member" "build_log_writer" {
  count = var.function_build_service_account == null ? 1 : 0

  project = var.project_id
  role    = "roles/logging.logWriter"
  member  = "serviceAccount:${google_service_account.build[0].email}"
}

# Push the built image, only to the repository the function builds into (build_config.docker_repository), not to the
# jobs' image repository and not project-wide. Artifact Registry roles can be granted on a repository.
# https://cloud.google.com/functions/docs/securing/build-custom-sa
# https://cloud.google.com/artifact-registry/docs/access-control
resource "google_artifact_registry_repository_iam_member" "build_writes_function_images" {
  count = var.function_build_service_account == null ? 1 : 0

  project    = var.project_id
  location   = var.region
  repository = google_artifact_registry_repository.docker["function_builds"].name
  role       = "roles/artifactregistry.writer"
  member     = "serviceAccount:${google_service_account.build[0].email}"
}

# Read (and, as Google's list allows, write) the function's source. Cloud Functions copies the uploaded zip into its own bucket,
# gcf-v2-sources-<project number>-<region>, under <function name>/, and the build fetches it from there ("Access to
# bucket gcf-v2-sources-... denied. You must grant Storage Object Viewer permission to <build account>"). That bucket
# is created by Cloud Functions on first use, so it cannot be granted on: Storage Object Admin on the project, limited
# by an IAM condition to this function's objects in it.
# https://cloud.google.com/functions/docs/securing/build-custom-sa
# https://cloud.google.com/functions/docs/building
# https://cloud.google.com/iam/docs/conditions-resource-attributes#resource-name
resource "google_project_iam_member" "build_reads_function_source" {
  count = var.function_build_service_account == null ? 1 : 0

  project = var.project_id
  role    = "roles/storage.objectAdmin"
  member  = "serviceAccount:${google_service_account.build[0].email}"

  condition {
    title       = "orbax2reg function source only"
    description = "The function's source as Cloud Functions stages it for the build: gs://gcf-v2-sources-<number>-<region>/<function>/."
    expression  = "resource.name.startsWith(\"projects/_/buckets/gcf-v2-sources-${data.google_project.this.number}-${var.region}/objects/${local.names.function}/\")"
  }
}

# ---------------------------------------------------------------------------------------------------------------------
# Image build service account (only when the module creates it)
# ---------------------------------------------------------------------------------------------------------------------
# A build that runs as a service account of one's own logs to Cloud Logging (image-build.cloudbuild.yaml:
# CLOUD_LOGGING_ONLY), which needs Logs Writer; it reads its source from Cloud Storage and pushes the image the
# Dockerfile made (https://cloud.google.com/build/docs/cloud-build-service-account lists what the default build
# account holds for these: storage.objects.get for the source, logging.logEntries.create, the push).

# Write the build's logs (Logs Writer is granted on the project).
# https://cloud.google.com/build/docs/securing-builds/configure-user-specified-service-accounts
resource "google_project_iam_member" "image_build_log_writer" {
  count = local.image_build_account_created ? 1 : 0

  project = var.project_id
  role    = "roles/logging.logWriter"
  member  = "serviceAccount:${google_service_account.image_build[0].email}"
}

# Push the jobs' image, to the jobs' repository only (not the function's, not project-wide).
# https://cloud.google.com/artifact-registry/docs/access-control
# https://cloud.google.com/build/docs/building/build-containers
resource "google_artifact_registry_repository_iam_member" "image_build_pushes_images" {
  count = local.image_build_account_created ? 1 : 0

  project    = var.project_id
  location   = var.region
  repository = google_artifact_registry_repository.docker["images"].name
  role       = "roles/artifactregistry.writer"
  member     = "serviceAccount:${google_service_account.image_build[0].email}"
}

# Read the build context gcloud staged in the module's bucket (build.tf), and nothing else in it: an IAM condition on
# the object name (the bucket has uniform bucket-level access, which conditions need).
# https://cloud.google.com/storage/docs/access-control/iam-roles
# https://cloud.google.com/iam/docs/conditions-resource-attributes#resource-name
resource "google_storage_bucket_iam_member" "image_build_reads_sources" {
  count = local.image_build_account_created ? 1 : 0

  bucket = google_storage_bucket.sources.name
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.image_build[0].email}"

  condition {
    title       = "orbax2reg image build contexts only"
    description = "The build contexts gcloud builds submit stages for the jobs' image."
    expression  = "resource.name.startsWith(\"projects/_/buckets/${google_storage_bucket.sources.name}/objects/${local.image_build_staging_prefix}/\")"
  }
}
