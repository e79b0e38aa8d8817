# The bucket's location decides the trigger's region; only read when trigger_region is not given.
data "google_storage_bucket" "checkpoint" {
  count = var.trigger_region == null ? 1 : 0

  name = var.checkpoint_bucket
  # Only fills the data source's `project` attribute; saves it a Compute API lookup.
  project = var.project_id
}

locals {
  # Eventarc Cloud Storage triggers must live in the bucket's location (lowercase; "US" -> "us").
  trigger_region = var.trigger_region != null ? var.trigger_region : lower(one(data.google_storage_bucket.checkpoint[*].location))
}

# Cloud Function (2nd gen) on every object finalized in the checkpoint bucket. It keeps only Orbax commit markers
# under checkpoint_prefixes, claims the step once and starts one workflow execution for it.
#
# Source: a zip the build uploads before `terraform apply` (function_source_bucket / function_source_object).
# The module does not zip a directory itself: the function is TypeScript compiled by the repository's build, and
# naming the object by its content hash makes every code change a new object, hence a redeploy.
resource "google_cloudfunctions2_function" "on_checkpoint" {
  project     = var.project_id
  name        = local.names.function
  location    = var.region
  description = "orbax2reg: start a conversion when an Orbax checkpoint step is committed in gs://${var.checkpoint_bucket}"
  labels      = var.labels

  build_config {
    runtime         = "nodejs22"
    entry_point     = "onCheckpointFinalized"
    service_account = var.function_build_service_account

    source {
      storage_source {
        bucket = var.function_source_bucket
        object = var.function_source_object
      }
    }
  }

  service_config {
    available_memory   = var.function_memory
    timeout_seconds    = var.function_timeout_seconds
    max_instance_count = var.function_max_instances
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
  # receive events before that (IAM can still take a few minutes to propagate on a fresh project).
  depends_on = [
    google_project_service.required,
    google_project_iam_member.gcs_agent_pubsub_publisher,
    google_project_iam_member.trigger_event_receiver,
  ]
}
