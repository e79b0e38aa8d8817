terraform {
  # 1.5: `check` blocks, startswith(), one() and preconditions are all available (terraform_data: 1.4).
  required_version = ">= 1.5"

  required_providers {
    google = {
      source = "hashicorp/google"
      # Attribute names in this module were checked against the v7.45.0 docs (Aug 2026).
      # `~> 7.45` allows 7.45.x and later 7.x, never 8.0 (which changes required fields).
      version = "~> 7.45"
    }
    archive = {
      source = "hashicorp/archive"
      # The function's and the image's source archives (build.tf). `source` blocks with content and a file name,
      # written without timestamps and in sorted order: the same files make the same zip. Checked against v2.7.1.
      version = "~> 2.7"
    }
  }
}
