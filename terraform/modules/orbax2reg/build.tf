# What the deployment runs is built from the repository (sources.tf) by Google Cloud, from one `terraform apply`:
# - the function: Cloud Functions builds it from the archive uploaded here (function.tf);
# - the jobs' image: a Cloud Build run of the Dockerfile, started by terraform through `gcloud builds submit` when
#   the image's sources change, tagged with their identity, which is the image the jobs run.
# Nothing is built on the operator's machine: it needs terraform and gcloud (the Cloud Build run), nothing else.
# Why this and not the function's own image or a released one: terraform/README.md, "How the code gets to Google
# Cloud".

# The bucket the module uploads its sources to: the function's archive, and the image's build context (gcloud stages
# it under orbax2reg/image-builds/). The module's own, so that the build accounts' read grants cover nothing else;
# uniform bucket-level access, which IAM conditions need (https://cloud.google.com/storage/docs/uniform-bucket-level-access);
# never public (https://cloud.google.com/storage/docs/public-access-prevention). It holds only what the module can
# make again, so destroying the module deletes it with its objects.
resource "google_storage_bucket" "sources" {
  project                     = var.project_id
  name                        = local.names.sources_bucket
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true
  labels                      = var.labels

  # A build context is read once, by its build.
  # https://cloud.google.com/storage/docs/lifecycle#matchesprefix-suffix
  lifecycle_rule {
    condition {
      age            = 7
      matches_prefix = ["${local.image_build_staging_prefix}/"]
    }
    action {
      type = "Delete"
    }
  }

  depends_on = [google_project_service.required]
}

locals {
  image_build_staging_prefix = "orbax2reg/image-builds"
  # Archives are written under the root configuration's .terraform directory (rewritten at every plan, never
  # committed); their names in the bucket and the image's tag come from sources.tf's identities instead.
  archive_dir = "${path.root}/.terraform/orbax2reg"
}

# ---------------------------------------------------------------------------------------------------------------------
# The function's source
# ---------------------------------------------------------------------------------------------------------------------

data "archive_file" "function_source" {
  count = var.function_source_object == null ? 1 : 0

  type        = "zip"
  output_path = "${local.archive_dir}/function-source.zip"

  dynamic "source" {
    for_each = local.function_source_files
    content {
      filename = source.value
      content  = file("${local.repository_root}/${source.value}")
    }
  }
  source {
    filename = "package.json"
    content  = local.function_package_json
  }
  source {
    filename = "package-lock.json"
    content  = local.function_package_lock
  }
  # The registry Cloud Functions' `npm ci` installs from, when npm_registry names one (npm reads the project's .npmrc:
  # https://docs.npmjs.com/cli/v10/configuring-npm/npmrc).
  dynamic "source" {
    for_each = local.function_npmrc == null ? [] : [local.function_npmrc]
    content {
      filename = ".npmrc"
      content  = source.value
    }
  }
}

resource "google_storage_bucket_object" "function_source" {
  count = var.function_source_object == null ? 1 : 0

  bucket       = google_storage_bucket.sources.name
  name         = local.function_source_object_name
  source       = data.archive_file.function_source[0].output_path
  content_type = "application/zip"
}

# ---------------------------------------------------------------------------------------------------------------------
# The jobs' image
# ---------------------------------------------------------------------------------------------------------------------

data "archive_file" "image_source" {
  count = var.image == null ? 1 : 0

  type        = "zip"
  output_path = "${local.archive_dir}/image-source.zip"

  # A source block takes text (https://registry.terraform.io/providers/hashicorp/archive/latest/docs/data-sources/file:
  # `content`, a string; file() reads UTF-8 only), so assets/ (export-hf's sentencepiece vocabularies, binary) goes in
  # as base64 (filebase64) under a .b64 name, which the Dockerfile decodes.
  dynamic "source" {
    for_each = local.image_source_files
    content {
      filename = startswith(source.value, "assets/") ? "${source.value}.b64" : source.value
      content  = startswith(source.value, "assets/") ? filebase64("${local.repository_root}/${source.value}") : file("${local.repository_root}/${source.value}")
    }
  }
}

locals {
  # The image the build pushes: orbax2reg:<identity> in the module's repository. Cloud Run resolves a job's tag to a
  # digest when the job is created or updated (https://cloud.google.com/run/docs/deploying-jobs), and the tag
  # changes exactly when the image's sources do.
  built_image = "${var.region}-docker.pkg.dev/${var.project_id}/${google_artifact_registry_repository.docker["images"].repository_id}/${local.names.image_package}:${local.image_tag}"
  image       = var.image != null ? var.image : local.built_image

  # image_build_region and the rule that checks it are in main.tf (locals only, evaluated offline by a test).

  # Package mirrors, given to the Dockerfile as build arguments only when set (image-build.cloudbuild.yaml defaults
  # them to empty: the public ones). Not part of the image's identity: the lockfile and the base decide what is built.
  image_build_substitutions = join(",", concat(
    ["_IMAGE=${local.built_image}", "_NODE_IMAGE=${var.image_build_node_image}"],
    var.npm_registry != null ? ["_NPM_REGISTRY=${var.npm_registry}"] : [],
    var.debian_mirror != null ? ["_DEBIAN_MIRROR=${var.debian_mirror}"] : [],
  ))
}

# One Cloud Build run of the Dockerfile per image identity (triggers_replace: a new identity replaces this resource,
# which runs the build; anything else leaves it, and the image, alone). `gcloud builds submit` uploads the archive to
# the sources bucket, builds it as the image build account with image-build.cloudbuild.yaml (logs to Cloud Logging
# only, which a build account of one's own needs) and waits for the result: a failed build fails the apply, and the
# jobs, which depend on this, are not touched. gcloud is run without a shell (the interpreter is gcloud itself, the
# command is the archive's path), so no quoting differs between systems.
# https://cloud.google.com/sdk/gcloud/reference/builds/submit
# https://cloud.google.com/build/docs/securing-builds/configure-user-specified-service-accounts
# https://developer.hashicorp.com/terraform/language/resources/provisioners/local-exec
resource "terraform_data" "image_build" {
  count = var.image == null ? 1 : 0

  triggers_replace = local.built_image

  provisioner "local-exec" {
    interpreter = concat(
      [
        "gcloud", "builds", "submit",
        "--project=${var.project_id}",
        "--region=${local.image_build_region}",
        "--config=${path.module}/image-build.cloudbuild.yaml",
        "--substitutions=${local.image_build_substitutions}",
        "--service-account=${local.image_build_service_account}",
        "--gcs-source-staging-dir=gs://${google_storage_bucket.sources.name}/${local.image_build_staging_prefix}",
        "--suppress-logs",
        "--quiet",
      ],
      var.image_build_worker_pool != null ? ["--worker-pool=${var.image_build_worker_pool}"] : [],
    )
    command = data.archive_file.image_source[0].output_path
  }

  lifecycle {
    precondition {
      condition     = local.image_build_region_chosen
      error_message = "region = \"${var.region}\" is not one of the regions where every project may run Cloud Build (${join(", ", local.cloud_build_unrestricted_regions)}); some projects are restricted to those, and their image build would fail with FAILED_PRECONDITION (https://cloud.google.com/build/docs/locations). Set image_build_region to one of them (the image is still pushed to ${var.region}), or to \"${var.region}\" if this project may build there, or set image_build_worker_pool, or image."
    }
  }

  # The build account's roles first (on a fresh project they may still take a minute or two to propagate: apply
  # again if the build is refused).
  depends_on = [
    google_project_service.required,
    google_project_iam_member.image_build_log_writer,
    google_artifact_registry_repository_iam_member.image_build_pushes_images,
    google_storage_bucket_iam_member.image_build_reads_sources,
  ]
}
