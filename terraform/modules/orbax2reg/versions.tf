terraform {
  # 1.5: `check` blocks, startswith(), one() and preconditions are all available.
  required_version = ">= 1.5"

  required_providers {
    google = {
      source = "hashicorp/google"
      # Attribute names in this module were checked against the v7.45.0 docs (Aug 2026).
      # `~> 7.45` allows 7.45.x and later 7.x, never 8.0 (which changes required fields).
      version = "~> 7.45"
    }
  }
}
