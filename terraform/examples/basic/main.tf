# Minimal deployment of the orbax2reg pipeline into one project, everything from one apply (the function's and the
# jobs' code are built by Google Cloud from this repository):
#   cp terraform.tfvars.example terraform.tfvars   (fill it in)
#   terraform init
#   terraform apply
# See terraform/README.md, "First deployment", for what to install and have first, and what gets created.

terraform {
  required_version = ">= 1.5"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 7.45"
    }
  }

  # Keep state out of the working tree in real use, e.g.:
  # backend "gcs" {
  #   bucket = "my-terraform-state"
  #   prefix = "orbax2reg"
  # }
}

provider "google" {
  project = var.project_id
  region  = var.region
}

# The regular checkpoints go to a bucket of their own unless told otherwise: written into the watched checkpoint bucket,
# every object a conversion writes is one more event, one more invocation of the function (docs/operations.md, "Event
# cost"). Given no destination_bucket, this example creates one. Destroying the example leaves it in place while it
# holds anything (force_destroy is off: Cloud Storage refuses to delete a bucket with objects in it).
locals {
  create_destination   = !var.convert_into_checkpoint_bucket && var.destination_bucket == null
  destination_bucket   = var.convert_into_checkpoint_bucket ? null : coalesce(var.destination_bucket, "${var.project_id}-orbax2reg-regular")
  default_template     = var.convert_into_checkpoint_bucket ? "gs://{bucket}/{root}/regular" : "gs://${local.destination_bucket}/{root}"
  destination_template = coalesce(var.destination_template, local.default_template)
}

resource "google_storage_bucket" "regular" {
  count = local.create_destination ? 1 : 0

  project  = var.project_id
  name     = local.destination_bucket
  location = coalesce(var.destination_location, upper(var.region))
  # The jobs' write grant and the function's claim grant are IAM conditions, honoured only with uniform bucket-level
  # access (https://cloud.google.com/storage/docs/uniform-bucket-level-access).
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"

  # Soft delete keeps deleted and overwritten objects, billed, for its retention (7 days unless set;
  # https://cloud.google.com/storage/docs/soft-delete): every step retention prunes and every record a conversion
  # rewrites. A regular checkpoint can be converted again from its Orbax step, so this example turns it off by default.
  soft_delete_policy {
    retention_duration_seconds = var.destination_soft_delete_seconds
  }
}

module "orbax2reg" {
  source = "../../modules/orbax2reg"

  project_id = var.project_id
  region     = var.region

  checkpoint_bucket    = var.checkpoint_bucket
  checkpoint_prefixes  = var.checkpoint_prefixes
  destination_bucket   = local.create_destination ? google_storage_bucket.regular[0].name : local.destination_bucket
  destination_template = local.destination_template

  # Which steps are converted, and how many converted steps are kept (default: every step, all kept).
  convert_every_n_steps = var.convert_every_n_steps
  keep_last_n           = var.keep_last_n
  keep_every_n_steps    = var.keep_every_n_steps

  # Only for the Eventarc trigger of a project whose Pub/Sub service agent predates 8 April 2021 (README).
  pubsub_agent_token_creator = var.pubsub_agent_token_creator

  # The jobs' image: built by the module from the repository (null), in a private pool if given; or a pinned one.
  image                   = var.image
  image_build_worker_pool = var.image_build_worker_pool
  image_build_region      = var.image_build_region

  deletion_protection = var.deletion_protection
}
