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

module "orbax2reg" {
  source = "../../modules/orbax2reg"

  project_id = var.project_id
  region     = var.region

  checkpoint_bucket    = var.checkpoint_bucket
  checkpoint_prefixes  = var.checkpoint_prefixes
  destination_bucket   = var.destination_bucket
  destination_template = var.destination_template

  # Which steps are converted, and how many converted steps are kept (default: every step, all kept).
  convert_every_n_steps = var.convert_every_n_steps
  keep_last_n           = var.keep_last_n
  keep_every_n_steps    = var.keep_every_n_steps

  # Only for the Eventarc trigger of a project whose Pub/Sub service agent predates 8 April 2021 (README).
  pubsub_agent_token_creator = var.pubsub_agent_token_creator

  # The jobs' image: built by the module from the repository (null), in a private pool if given; or a pinned one.
  image                   = var.image
  image_build_worker_pool = var.image_build_worker_pool

  deletion_protection = var.deletion_protection
}
