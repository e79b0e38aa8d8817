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
  description = "Bucket for the regular checkpoints; null writes them next to the Orbax ones in checkpoint_bucket."
  type        = string
  default     = null
}

variable "destination_template" {
  description = "Destination root per checkpoint, with {bucket}, {root} and {step} placeholders (see the module's README)."
  type        = string
  default     = "gs://{bucket}/{root}/regular"
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

variable "deletion_protection" {
  description = "Protect the workflow and jobs from destroy/replace. Set false and apply once before terraform destroy."
  type        = bool
  default     = true
}
