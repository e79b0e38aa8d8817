# Names and values derived from the variables alone (no resource or data source in here, so the checks below can
# be evaluated offline). The resources live in one file per service: apis.tf, iam.tf, function.tf, workflow.tf,
# jobs.tf, pubsub.tf, artifact_registry.tf.

locals {
  names = {
    function       = "${var.name_prefix}-on-checkpoint"
    workflow       = "${var.name_prefix}-convert"
    plan_job       = "${var.name_prefix}-plan"
    group_job      = "${var.name_prefix}-convert-group"
    finalize_job   = "${var.name_prefix}-finalize"
    export_job     = "${var.name_prefix}-export"
    function_sa    = "${var.name_prefix}-fn"
    trigger_sa     = "${var.name_prefix}-trigger"
    workflow_sa    = "${var.name_prefix}-workflow"
    jobs_sa        = "${var.name_prefix}-jobs"
    build_sa       = "${var.name_prefix}-build"
    image_build_sa = "${var.name_prefix}-imgbuild"
    image_package  = "orbax2reg"
    # The module's bucket for the sources it builds from (build.tf). Bucket names are global; a project id is
    # unique, so this one is the project's.
    sources_bucket = "${var.project_id}-${var.name_prefix}-sources"
    # Artifact Registry repository the function's build pushes its image to (build_config.docker_repository).
    function_repository = "${var.name_prefix}-function-builds"
  }

  # The regular checkpoints land in destination_bucket; by default that is the checkpoint bucket itself.
  destination_bucket = coalesce(var.destination_bucket, var.checkpoint_bucket)

  # The bucket part of destination_template must name destination_bucket ({bucket} means the checkpoint bucket),
  # otherwise the jobs would be granted write access to one bucket and told to write to another.
  template_bucket              = regex("^gs://([^/]+)", var.destination_template)[0]
  destination_matches_template = local.template_bucket == "{bucket}" ? local.destination_bucket == var.checkpoint_bucket : local.template_bucket == local.destination_bucket

  # What the jobs may write and delete: the destination only, never a source checkpoint (iam.tf's jobs grant). An IAM
  # condition on resource.name (projects/_/buckets/BUCKET/objects/OBJECT for an object; startsWith, endsWith and
  # extract are the functions it supports: https://cloud.google.com/iam/docs/conditions-attribute-reference#resource-name)
  # expresses it in one of three ways, picked from destination_template's path (the part after gs://bucket/):
  # - "prefix": a separate destination bucket, or a template that starts with a fixed path (gs://{bucket}/regular/{root}):
  #   every object under that bucket or path;
  # - "beside-root": the default gs://{bucket}/{root}/regular in the checkpoint bucket: a destination is a directory
  #   named "regular" in a checkpoint root, and the jobs write only its step_XXXXXXXX/ and .orbax2reg/, so the condition
  #   allows the names with "/regular/step_" or "/regular/.orbax2reg/" after some root (extract() returns "" when its
  #   template does not occur). Only a checkpoint root itself named "regular" inside another root would be writable: it
  #   is that root's destination by name, and docs/operations.md says not to put checkpoints there;
  # - "none": anything else in the checkpoint bucket (gs://{bucket}/{root}, gs://{bucket}/{step}/...), which no name
  #   test can tell from a source; refused by a precondition (use destination_bucket).
  template_path     = trim(replace(var.destination_template, "/^gs://[^/]+/", ""), "/")
  template_fixed    = regex("^[^{]*", local.template_path)
  template_beside   = startswith(local.template_path, "{root}/") ? trim(trimprefix(local.template_path, "{root}"), "/") : ""
  destination_apart = local.destination_bucket != var.checkpoint_bucket
  jobs_write_form = (
    local.destination_apart || local.template_fixed != "" ? "prefix" :
    local.template_beside != "" && !strcontains(local.template_beside, "{") ? "beside-root" : "none"
  )
  destination_objects = "projects/_/buckets/${local.destination_bucket}/objects/"
  # A template without placeholders names one directory: its objects are under "<path>/".
  jobs_write_prefix = "${local.destination_objects}${local.template_fixed == local.template_path && local.template_path != "" ? "${local.template_path}/" : local.template_fixed}"
  jobs_write_condition = {
    prefix = "resource.name.startsWith(\"${local.jobs_write_prefix}\")"
    "beside-root" = join(" || ", flatten([
      for inside in ["step_", ".orbax2reg/"] : [
        "resource.name.startsWith(\"${local.destination_objects}${local.template_beside}/${inside}\")",
        "resource.name.extract(\"${local.destination_objects}{root}/${local.template_beside}/${inside}\") != \"\"",
      ]
    ]))
    none = "false"
  }[local.jobs_write_form]

  # The Hugging Face export's folders (hf_export.destination_template, ending in {step}), written by the export job as the
  # regular checkpoints are by the others: its bucket is the checkpoint bucket or destination_bucket (the jobs list and
  # read both already), and its objects are granted by a condition of the same three forms, with {step} standing for
  # the step_ names the jobs write: "prefix" (a separate destination bucket, or a fixed path first), "beside-root"
  # (gs://{bucket}/{root}/<dir>/{step}: names with "/<dir>/step_" after some root), or "none" (refused).
  export_on            = var.hf_export != null
  export_template      = local.export_on ? var.hf_export.destination_template : "gs://{bucket}/{root}/hf/{step}"
  export_template_head = regex("^gs://([^/]+)", local.export_template)[0]
  export_bucket        = local.export_template_head == "{bucket}" ? var.checkpoint_bucket : local.export_template_head
  export_bucket_known  = contains([var.checkpoint_bucket, local.destination_bucket], local.export_bucket)
  export_path          = trim(replace(local.export_template, "/^gs://[^/]+/", ""), "/")
  export_fixed         = regex("^[^{]*", local.export_path)
  # gs://{bucket}/{root}/hf/{step} -> "hf/": the folder the step_ folders are in, beside each root.
  export_beside = startswith(local.export_path, "{root}/") ? trimsuffix(trimprefix(local.export_path, "{root}/"), "{step}") : ""
  export_write_form = (
    local.export_bucket != var.checkpoint_bucket || local.export_fixed != "" ? "prefix" :
    local.export_beside != "" && !strcontains(local.export_beside, "{") ? "beside-root" : "none"
  )
  export_objects = "projects/_/buckets/${local.export_bucket}/objects/"
  export_write_condition = {
    prefix = "resource.name.startsWith(\"${local.export_objects}${local.export_fixed}\")"
    "beside-root" = join(" || ", [
      "resource.name.startsWith(\"${local.export_objects}${local.export_beside}step_\")",
      "resource.name.extract(\"${local.export_objects}{root}/${local.export_beside}step_\") != \"\"",
    ])
    none = "false"
  }[local.export_write_form]

  # The function's source is the module's own archive (function_source_object null) or an object uploaded before:
  # in the module's bucket, or in function_source_bucket when that is given. A bucket without an object names nothing.
  function_source_given = var.function_source_bucket == null || var.function_source_object != null

  # workflows/convert.yaml waits up to 7 days (604800 s) for one job execution, every task retry included.
  job_wait_fits = tonumber(trimsuffix(var.task_timeout, "s")) * (var.max_retries + 1) <= 604800
  # How long the workflow waits for one job execution unless the argument says (ORBAX2REG_JOB_TIMEOUT): twice the
  # longest a task may take with all its retries, for tasks that queue for capacity, at most the 7 days. Its polls back
  # off to a cap proportional to this wait (docs/workflows-reference.md, "The step budget"): a realistic wait keeps
  # them minutes apart.
  job_timeout_seconds = min(604800, 2 * tonumber(trimsuffix(var.task_timeout, "s")) * (var.max_retries + 1))

  # The three Cloud Run jobs by phase (jobs.tf's google_cloud_run_v2_job.phase has one instance per key; the key is
  # the job's `node dist/jobs/main.js <phase>` argument): its name, its size and the variables that set the size (for
  # the error message of its shape check).
  conversion_jobs = {
    plan = {
      name            = local.names.plan_job
      cpu             = var.plan_cpu
      memory          = var.plan_memory
      cpu_variable    = "plan_cpu"
      memory_variable = "plan_memory"
    }
    "convert-group" = {
      name            = local.names.group_job
      cpu             = var.group_cpu
      memory          = var.group_memory
      cpu_variable    = "group_cpu"
      memory_variable = "group_memory"
    }
    finalize = {
      name            = local.names.finalize_job
      cpu             = var.finalize_cpu
      memory          = var.finalize_memory
      cpu_variable    = "finalize_cpu"
      memory_variable = "finalize_memory"
    }
  }
  # With hf_export: the export job, one job for the export's three phases (export-begin, export-shards, export-finalize:
  # the workflow gives each execution its phase as an args override), keyed by the phase it runs most.
  export_job = {
    "export-shards" = {
      name            = local.names.export_job
      cpu             = local.export_on ? var.hf_export.cpu : "1"
      memory          = local.export_on ? var.hf_export.memory : "1Gi"
      cpu_variable    = "hf_export.cpu"
      memory_variable = "hf_export.memory"
    }
  }
  jobs = merge(local.conversion_jobs, { for k, v in local.export_job : k => v if local.export_on })

  # The memory (MiB) Cloud Run jobs allow with each vCPU count, checked both ways: 4 vCPU need at least 2Gi, 6 and 8
  # vCPU 4Gi (https://cloud.google.com/run/docs/configuring/jobs/cpu, "vCPU and memory table"); more than 4Gi needs 2
  # vCPU, more than 8Gi 4, 16Gi 6, 24Gi 8, at most 32Gi, at least 512Mi
  # (https://cloud.google.com/run/docs/configuring/jobs/memory-limits). Otherwise the plan passes and the apply fails.
  job_memory_range_mib = {
    "1" = { min = 512, max = 4096 }
    "2" = { min = 512, max = 8192 }
    "4" = { min = 2048, max = 16384 }
    "6" = { min = 4096, max = 24576 }
    "8" = { min = 4096, max = 32768 }
  }
  # The function is a Cloud Run service: the same vCPU/memory pairs (https://cloud.google.com/run/docs/configuring/services/cpu,
  # "vCPU and memory table"; available_cpu "supports the same values as Cloud Run":
  # https://cloud.google.com/functions/docs/reference/rest/v2/projects.locations.functions#ServiceConfig). Memory may be
  # given in M / G (10^6, 10^9 bytes) as well as Mi / Gi.
  function_memory_mib = tonumber(regex("^[0-9]+", var.function_memory)) * lookup(
    { M = 1000000 / 1048576, Mi = 1, G = 1000000000 / 1048576, Gi = 1024 },
    regex("[A-Za-z]+$", var.function_memory),
  )
  function_shape_ok = (
    local.function_memory_mib >= local.job_memory_range_mib[var.function_cpu].min &&
    local.function_memory_mib <= local.job_memory_range_mib[var.function_cpu].max
  )
  job_memory_mib = {
    for phase, s in local.jobs : phase => tonumber(regex("^[0-9]+", s.memory)) * (endswith(s.memory, "Gi") ? 1024 : 1)
  }
  job_shape_ok = {
    for phase, s in local.jobs : phase => (
      local.job_memory_mib[phase] >= local.job_memory_range_mib[s.cpu].min &&
      local.job_memory_mib[phase] <= local.job_memory_range_mib[s.cpu].max
    )
  }
}

# Where the jobs' image is built (build.tf).
locals {
  # A private pool's builds run in the pool's region (https://cloud.google.com/build/docs/private-pools/run-builds-in-private-pool).
  # In the default pool: image_build_region, else region when every project may build there. "Depending on usage, some
  # projects might be restricted to only use Cloud Build in the following regions": a build elsewhere fails with
  # FAILED_PRECONDITION, at apply, after everything else is made, and no apply recovers; so a region outside those six
  # must be chosen at plan time (image_build_region; the precondition below). https://cloud.google.com/build/docs/locations
  cloud_build_unrestricted_regions = ["us-central1", "us-west2", "europe-west1", "asia-east1", "australia-southeast1", "southamerica-east1"]
  image_build_region = (
    var.image_build_worker_pool != null ? regex("/locations/([^/]+)/", var.image_build_worker_pool)[0] :
    var.image_build_region != null ? var.image_build_region : var.region
  )
  image_build_region_chosen = var.image_build_worker_pool != null || var.image_build_region != null || contains(local.cloud_build_unrestricted_regions, var.region)
}
