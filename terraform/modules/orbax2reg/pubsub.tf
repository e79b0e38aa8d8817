# Pipeline events (conversion.requested / .succeeded / .failed, schema in docs/events.md), published by the function
# and the workflow.
resource "google_pubsub_topic" "events" {
  project = var.project_id
  name    = var.events_topic_name
  labels  = var.labels

  depends_on = [google_project_service.required]
}
