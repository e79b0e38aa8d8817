# The bucket's location decides the trigger's region; only read when trigger_region is not given. Read after the APIs
# are enabled, as the other data sources are: a first plan calls no API (deferred to apply).
data "google_storage_bucket" "checkpoint" {
  count = var.trigger_region == null ? 1 : 0

  name = var.checkpoint_bucket
  # Only fills the data source's `project` attribute; saves it a Compute API lookup.
  project = var.project_id

  depends_on = [terraform_data.apis_enabled]
}

locals {
  # Eventarc Cloud Storage triggers must live in the bucket's location (lowercase; "US" -> "us").
  trigger_region = var.trigger_region != null ? var.trigger_region : lower(one(data.google_storage_bucket.checkpoint[*].location))
}

# Cloud Function (2nd gen) on every object finalized in the checkpoint bucket. It keeps only Orbax commit markers
# under checkpoint_prefixes, claims the step once and starts one workflow execution for it.
#
# Source: the archive build.tf uploads (the function's TypeScript with the lockfile; Cloud Functions' build compiles it,
# sources.tf), named by its content, so every code change is a new object, hence a rebuild and redeploy, and nothing
# else is. Or an object uploaded before (function_source_object, in function_source_bucket or the module's bucket).
locals {
  function_source_bucket = var.function_source_bucket != null ? var.function_source_bucket : google_storage_bucket.sources.name
  function_source_object = var.function_source_object != null ? var.function_source_object : one(google_storage_bucket_object.function_source[*].name)

  # The build runs as function_build_service_account when given, else as the <prefix>-build account iam.tf creates.
  build_service_account = var.function_build_service_account != null ? var.function_build_service_account : one(google_service_account.build[*].id)
}

resource "google_cloudfunctions2_function" "on_checkpoint" {
  project     = var.project_id
  name        = local.names.function
  location    = var.region
  description = "orbax2reg: start a conversion when an Orbax checkpoint step is committed in gs://${var.checkpoint_bucket}"
  labels      = var.labels

  build_config {
    runtime     = "nodejs22"
    entry_point = "onCheckpointFinalized"
    # A dedicated build identity (new projects' default one lacks the permissions to build a function) that pushes
    # only to the module's own repository: https://cloud.google.com/functions/docs/securing/build-custom-sa
    service_account   = local.build_service_account
    docker_repository = google_artifact_registry_repository.docker["function_builds"].id
    # An organization may require builds in a worker pool: https://cloud.google.com/functions/docs/securing/custom-constraints
    worker_pool = var.function_build_worker_pool

    source {
      storage_source {
        bucket = local.function_source_bucket
        object = local.function_source_object
      }
    }
  }

  service_config {
    available_memory = var.function_memory
    # A whole vCPU, so that one instance takes many events at once: a concurrency above 1 needs at least one
    # (https://cloud.google.com/functions/docs/configuring/concurrency). Nearly every event is an object the conversion
    # or the training job wrote, dismissed by a name test (src/cloud/trigger/classify.ts): at Cloud Run functions'
    # default of one request per instance, each of them would hold an instance for its round trip.
    available_cpu                    = var.function_cpu
    max_instance_request_concurrency = var.function_concurrency
    timeout_seconds                  = var.function_timeout_seconds
    max_instance_count               = var.function_max_instances
    # Eventarc deliveries count as internal traffic; nothing else needs to reach the function.
    ingress_settings               = "ALLOW_INTERNAL_ONLY"
    all_traffic_on_latest_revision = true
    service_account_email          = google_service_account.function.email

    environment_variables = {
      ORBAX2REG_WORKFLOW             = google_workflows_workflow.convert.id
      ORBAX2REG_ROOT_PREFIXES        = join(",", var.checkpoint_prefixes)
      ORBAX2REG_DESTINATION_TEMPLATE = var.destination_template
      ORBAX2REG_EVENTS_TOPIC         = google_pubsub_topic.events.id
      ORBAX2REG_GROUPS               = tostring(var.groups)
      # Only steps divisible by this are converted.
      ORBAX2REG_CONVERT_EVERY_N_STEPS = tostring(var.convert_every_n_steps)
      # A claim whose delivery died (no execution recorded in it) may be taken over after this long; it must exceed
      # the function's timeout, so that a live delivery never loses its claim.
      ORBAX2REG_CLAIM_LEASE_SECONDS = tostring(var.function_timeout_seconds + 60)
      # hf_export: which steps are exported, where and how (src/cloud/trigger/config.ts). An empty template: no export.
      ORBAX2REG_EXPORT_DESTINATION_TEMPLATE = local.export_on ? var.hf_export.destination_template : ""
      ORBAX2REG_EXPORT_EVERY_N_STEPS        = local.export_on ? tostring(coalesce(var.hf_export.every_n_steps, 0)) : ""
      ORBAX2REG_EXPORT_STEPS                = local.export_on ? join(",", [for s in var.hf_export.steps : tostring(s)]) : ""
      ORBAX2REG_EXPORT_DTYPE                = local.export_on ? var.hf_export.dtype : ""
      ORBAX2REG_EXPORT_TOKENIZER            = local.export_on ? (var.hf_export.tokenizer == null ? "" : var.hf_export.tokenizer) : ""
      ORBAX2REG_EXPORT_MAX_SHARD_SIZE       = local.export_on ? var.hf_export.max_shard_size : ""
      ORBAX2REG_EXPORT_TASKS                = local.export_on ? tostring(var.hf_export.tasks) : ""
    }
  }

  event_trigger {
    event_type     = "google.cloud.storage.object.v1.finalized"
    trigger_region = local.trigger_region
    # Failed invocations are redelivered with backoff for up to 24 h; the function must be idempotent (it claims).
    retry_policy          = "RETRY_POLICY_RETRY"
    service_account_email = google_service_account.trigger.email

    event_filters {
      attribute = "bucket"
      value     = var.checkpoint_bucket
    }
  }

  # The trigger is created with the function: the GCS agent must be able to publish and the trigger identity to
  # receive events before that, and the build account needs its roles before the build starts (IAM can still take a
  # few minutes to propagate on a fresh project).
  depends_on = [
    google_project_service.required,
    google_project_iam_member.gcs_agent_pubsub_publisher,
    google_project_iam_member.trigger_event_receiver,
    google_project_iam_member.pubsub_agent_token_creator,
    google_project_iam_member.build_log_writer,
    google_artifact_registry_repository_iam_member.build_writes_function_images,
    google_project_iam_member.build_reads_function_source,
  ]

  lifecycle {
    precondition {
      condition     = local.function_shape_ok
      error_message = "function_cpu = ${var.function_cpu} with function_memory = ${var.function_memory} do not fit Cloud Run (1 vCPU takes 512Mi-4Gi, 2 vCPU 512Mi-8Gi, 4 vCPU 2Gi-16Gi, 6 vCPU 4Gi-24Gi, 8 vCPU 4Gi-32Gi)."
    }
    precondition {
      condition     = local.function_source_given
      error_message = "function_source_bucket is set but function_source_object is not: name the object in that bucket, or leave both null to deploy the module's own archive of the repository."
    }
  }
}
