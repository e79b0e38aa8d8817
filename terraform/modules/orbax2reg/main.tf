# Names and values derived from the variables alone (no resource or data source in here, so the checks below can
# be evaluated offline). The resources live in one file per service: apis.tf, iam.tf, function.tf, workflow.tf,
# jobs.tf, pubsub.tf, artifact_registry.tf.

locals {
  names = {
    function      = "${var.name_prefix}-on-checkpoint"
    workflow      = "${var.name_prefix}-convert"
    plan_job      = "${var.name_prefix}-plan"
    group_job     = "${var.name_prefix}-convert-group"
    finalize_job  = "${var.name_prefix}-finalize"
    function_sa   = "${var.name_prefix}-fn"
    trigger_sa    = "${var.name_prefix}-trigger"
    workflow_sa   = "${var.name_prefix}-workflow"
    jobs_sa       = "${var.name_prefix}-jobs"
    build_sa      = "${var.name_prefix}-build"
    image_package = "orbax2reg"
    # Artifact Registry repository the function's build pushes its image to (build_config.docker_repository).
    function_repository = "${var.name_prefix}-function-builds"
  }

  # The regular checkpoints land in destination_bucket; by default that is the checkpoint bucket itself.
  destination_bucket = coalesce(var.destination_bucket, var.checkpoint_bucket)

  # The bucket part of destination_template must name destination_bucket ({bucket} means the checkpoint bucket),
  # otherwise the jobs would be granted write access to one bucket and told to write to another.
  template_bucket              = regex("^gs://([^/]+)", var.destination_template)[0]
  destination_matches_template = local.template_bucket == "{bucket}" ? local.destination_bucket == var.checkpoint_bucket : local.template_bucket == local.destination_bucket

  # The function's source comes either as a local zip the module uploads or as an object uploaded before.
  function_source_given = (var.function_source_zip == null) != (var.function_source_object == null)

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
  jobs = {
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
