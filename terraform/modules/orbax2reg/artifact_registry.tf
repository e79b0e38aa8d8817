locals {
  # Both repositories' cleanup: every code change pushes a new image, kept and billed forever without a policy: of
  # each package, the newest image_versions_kept versions stay, older ones go once a day old (a keep policy wins over
  # a delete policy). https://cloud.google.com/artifact-registry/docs/repositories/cleanup-policy
  image_cleanup_policies = [
    { id = "delete-old", action = "DELETE", older_than = "86400s", keep_count = null },
    { id = "keep-newest", action = "KEEP", older_than = null, keep_count = var.image_versions_kept },
  ]

  # The module's two Docker repositories, one resource for both so they share the cleanup above.
  docker_repositories = {
    # The job image (orbax2reg:<tag>). Pushing to it is the module's build's job (build.tf), not Terraform's.
    images = {
      repository_id = var.artifact_repository_id
      description   = "orbax2reg container images (Cloud Run jobs: plan, convert-group, finalize)"
    }
    # Images Cloud Build makes of the trigger function (build_config.docker_repository). The module's own repository
    # rather than the gcf-artifacts one Cloud Functions creates on first use: the build service account is granted
    # Artifact Registry Writer on exactly this repository, so it can neither push to the jobs' repository above nor
    # anywhere else in the project. https://cloud.google.com/functions/docs/securing/build-custom-sa
    function_builds = {
      repository_id = local.names.function_repository
      description   = "orbax2reg: images Cloud Build makes of the trigger function (written by the function's build only)"
    }
  }
}

resource "google_artifact_registry_repository" "docker" {
  for_each = local.docker_repositories

  project       = var.project_id
  location      = var.region
  repository_id = each.value.repository_id
  format        = "DOCKER"
  description   = each.value.description
  labels        = var.labels

  cleanup_policy_dry_run = false
  dynamic "cleanup_policies" {
    for_each = local.image_cleanup_policies
    content {
      id     = cleanup_policies.value.id
      action = cleanup_policies.value.action
      dynamic "condition" {
        for_each = cleanup_policies.value.older_than == null ? [] : [cleanup_policies.value.older_than]
        content {
          tag_state  = "ANY"
          older_than = condition.value
        }
      }
      dynamic "most_recent_versions" {
        for_each = cleanup_policies.value.keep_count == null ? [] : [cleanup_policies.value.keep_count]
        content {
          keep_count = most_recent_versions.value
        }
      }
    }
  }

  depends_on = [google_project_service.required]
}

# The repositories were two resources before (google_artifact_registry_repository.images and .function_builds): these
# blocks move their state to the instances above, so a deployment keeps its repositories and their images.
# https://developer.hashicorp.com/terraform/language/modules/develop/refactoring
moved {
  from = google_artifact_registry_repository.images
  to   = google_artifact_registry_repository.docker["images"]
}

moved {
  from = google_artifact_registry_repository.function_builds
  to   = google_artifact_registry_repository.docker["function_builds"]
}
