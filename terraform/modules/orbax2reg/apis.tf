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

# What the data sources that need an API wait for, instead of google_project_service.required itself. Terraform reads a
# data source at apply instead of plan when something it depends on has a change planned
# (https://developer.hashicorp.com/terraform/language/data-sources#data-resource-behavior), and the values read then
# are unknown at plan: a grant whose member is such a value (the Cloud Storage and Pub/Sub service agents, the project
# number) would be destroyed and created again, and while it is gone Cloud Storage cannot publish to the trigger's topic,
# so commit markers written meanwhile never reach Eventarc. This resource has nothing that changes: it is created once,
# after the APIs, so the first plan calls no API (the reads wait for apply); every later plan reads the data sources
# then, whatever is added to the APIs (monitoring, for the alerts and the dashboard), and the grants stay as they are.
# test/terraform/later-apply.test.ts plans a later apply against a deployed state with the real provider.
resource "terraform_data" "apis_enabled" {
  depends_on = [google_project_service.required]
}
