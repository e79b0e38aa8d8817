variable "project_id" {
  description = "Project to deploy into (it must own checkpoint_bucket)."
  type        = string
}

variable "region" {
  description = "Region of the function, workflow, jobs and image repository; should match the checkpoint bucket's location."
  type        = string
  default     = "us-central1"
}

variable "checkpoint_bucket" {
  description = "Existing bucket the Orbax checkpoints are written to (name only, no gs://)."
  type        = string
}

variable "checkpoint_prefixes" {
  description = "Paths inside the bucket under which checkpoint roots are watched, e.g. [\"runs\"]; [\"\"] watches the whole bucket."
  type        = list(string)
  default     = [""]
}

variable "destination_bucket" {
  description = "An existing bucket (uniform bucket-level access enabled) for the regular checkpoints. null: this example creates <project_id>-orbax2reg-regular for them, unless convert_into_checkpoint_bucket is true."
  type        = string
  default     = null
}

variable "convert_into_checkpoint_bucket" {
  description = "Write the regular checkpoints next to the Orbax ones in checkpoint_bucket (gs://{bucket}/{root}/regular) instead of a bucket of their own. Every object a conversion writes there is then one more event for the function (docs/operations.md, \"Event cost\")."
  type        = bool
  default     = false
  nullable    = false
}

variable "destination_template" {
  description = "Destination root per checkpoint, with {bucket}, {root} and {step} placeholders (see the module's README). null: gs://<destination bucket>/{root}, or gs://{bucket}/{root}/regular with convert_into_checkpoint_bucket."
  type        = string
  default     = null
}

variable "destination_location" {
  description = "Location of the bucket this example creates for the regular checkpoints; null: region (the jobs write it from there)."
  type        = string
  default     = null
}

variable "destination_soft_delete_seconds" {
  description = "Soft delete retention of the bucket this example creates: 0 (the default) turns soft delete off, since every converted step can be converted again from its Orbax checkpoint; 604800 (7 days, Cloud Storage's default) to 7776000 (90 days) keeps deleted and overwritten objects, billed, that long (https://cloud.google.com/storage/docs/soft-delete)."
  type        = number
  default     = 0
  nullable    = false

  validation {
    condition     = var.destination_soft_delete_seconds == 0 || (var.destination_soft_delete_seconds >= 604800 && var.destination_soft_delete_seconds <= 7776000)
    error_message = "destination_soft_delete_seconds must be 0 (off) or 604800 to 7776000 (7 to 90 days)."
  }
}

variable "convert_every_n_steps" {
  description = "Convert only steps whose number is divisible by this; 1 converts every step."
  type        = number
  default     = 1
}

variable "keep_last_n" {
  description = "Keep the newest N converted steps (AXLearn's keep_last_n); null keeps every step unless keep_every_n_steps is set."
  type        = number
  default     = null
}

variable "keep_every_n_steps" {
  description = "Of the older converted steps, keep one at least every N steps (AXLearn's keep_every_n_steps); null turns the rule off."
  type        = number
  default     = null
}

variable "pubsub_agent_token_creator" {
  description = "Grant the Pub/Sub service agent Service Account Token Creator: only for a project whose Pub/Sub service agent was created on or before 8 April 2021 (see terraform/README.md)."
  type        = bool
  default     = false
}

variable "image" {
  description = "A pinned image for the jobs instead of the one the module builds from the repository (null)."
  type        = string
  default     = null
}

variable "image_build_worker_pool" {
  description = "Cloud Build private pool for the image's build, projects/<p>/locations/<r>/workerPools/<pool>; null: the default pool."
  type        = string
  default     = null
}

variable "image_build_region" {
  description = "Region of the image's build in Cloud Build's default pool; null: region, which the plan then requires to be one of us-central1, us-west2, europe-west1, asia-east1, australia-southeast1, southamerica-east1 (some projects may build only there)."
  type        = string
  default     = null
}

variable "deletion_protection" {
  description = "Protect the workflow and jobs from destroy/replace. Set false and apply once before terraform destroy."
  type        = bool
  default     = true
}
