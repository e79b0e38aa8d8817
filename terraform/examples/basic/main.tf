# Minimal deployment of the orbax2reg pipeline into one project:
#   terraform init
#   terraform apply -var-file=terraform.tfvars     (copy terraform.tfvars.example first)
# See terraform/README.md for what gets created, the first-apply order (image before jobs) and destroying.

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

  function_source_bucket = var.function_source_bucket
  # One of the two: a CI-uploaded object wins over the local zip.
  function_source_zip    = var.function_source_object == null ? var.function_source_zip : null
  function_source_object = var.function_source_object

  image_tag = var.image_tag

  deletion_protection = var.deletion_protection
}
