locals {
  # workflowexecutions is a separate API from workflows: without it executions cannot be created. cloudresourcemanager
  # serves data.google_project (the project number for the service agents) and every google_project_iam_member
  # (getIamPolicy / setIamPolicy on the project): https://cloud.google.com/resource-manager/reference/rest.
  required_apis = toset(concat([
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudfunctions.googleapis.com",
    # `orbax2reg cloud check` reads the region's Cloud Run CPU and memory quotas through the Cloud Quotas API
    # (https://cloud.google.com/docs/quotas/reference/rest/v1/projects.locations.services.quotaInfos/get).
    "cloudquotas.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "eventarc.googleapis.com",
    "iam.googleapis.com",
    "logging.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
    "storage.googleapis.com",
    "workflowexecutions.googleapis.com",
    "workflows.googleapis.com",
    ],
    # The failure alerts' policies (alerts.tf), only when notification_channels asks for them, and the dashboard
    # (dashboard.tf), only when var.dashboard does.
    local.alerts || var.dashboard ? ["monitoring.googleapis.com"] : [],
  ))
}

resource "google_project_service" "required" {
  for_each = var.enable_apis ? local.required_apis : toset([])

  project = var.project_id
  service = each.value

  # Other workloads in the project may use these APIs: destroying this module must not switch them off.
  disable_on_destroy = false
}
