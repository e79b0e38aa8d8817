# Docker repository for the job image (orbax2reg:<tag>). Pushing to it is CI's job, not Terraform's.
resource "google_artifact_registry_repository" "images" {
  project       = var.project_id
  location      = var.region
  repository_id = var.artifact_repository_id
  format        = "DOCKER"
  description   = "orbax2reg container images (Cloud Run jobs: plan, convert-group, finalize)"
  labels        = var.labels

  depends_on = [google_project_service.required]
}
