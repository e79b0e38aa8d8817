# Three Cloud Run jobs running the same image, one per phase of the conversion: `node dist/jobs/main.js <phase>`.
# They are the instances of one resource, google_cloud_run_v2_job.phase, one per key of local.jobs (main.tf: the name,
# CPU and memory of each phase).
# The jobs read everything conversion-specific (the plan job: the workflow's argument, ORBAX2REG_ARGUMENT; the others
# ORBAX2REG_SOURCE, ORBAX2REG_STEP, ORBAX2REG_GROUP, ...) from environment variables the workflow sets per execution as
# container overrides; the
# definitions here fix the image, command, size, timeout, retries, identity and the static environment (local.job_env:
# job_env, the project and region, and for finalize the retention policy and the events topic).
# The image (local.image, build.tf) is the one the module's Cloud Build run made of the repository, tagged with its
# sources' identity (or the pinned `image` given): the jobs wait for that build, and are updated when it changes.
#
# deletion_protection: the provider refuses to destroy (or replace) a job while this is true. It defaults to true
# here as in the provider; see the README for the two-step destroy.

locals {
  # Static environment of each job, under the workflow's per-execution overrides: Cloud Run merges a job's env with an
  # execution's container overrides, the overrides winning.
  # https://cloud.google.com/run/docs/reference/rest/v2/projects.locations.jobs/run#containeroverride
  # Every job: where it runs (its code names its Cloud Run executions from these). These win over job_env.
  job_location_env = {
    ORBAX2REG_PROJECT = var.project_id
    ORBAX2REG_REGION  = var.region
  }
  # finalize only: the retention policy (a rule left null is not set, i.e. off) and the topic for conversion.pruned.
  finalize_env = merge(
    { ORBAX2REG_EVENTS_TOPIC = google_pubsub_topic.events.id },
    {
      for name, value in {
        ORBAX2REG_KEEP_LAST_N        = var.keep_last_n
        ORBAX2REG_KEEP_EVERY_N_STEPS = var.keep_every_n_steps
      } : name => tostring(value) if value != null
    },
  )
  # The export job (hf_export): the exports' own retention, apart from the regular checkpoints' (a rule left null is off).
  export_env = {
    for name, value in {
      ORBAX2REG_EXPORT_KEEP_LAST_N        = try(var.hf_export.keep_last_n, null)
      ORBAX2REG_EXPORT_KEEP_EVERY_N_STEPS = try(var.hf_export.keep_every_n_steps, null)
    } : name => tostring(value) if value != null
  }
  job_env = {
    plan            = merge(var.job_env, local.job_location_env)
    "convert-group" = merge(var.job_env, local.job_location_env)
    finalize        = merge(var.job_env, local.job_location_env, local.finalize_env)
    "export-shards" = merge(var.job_env, local.job_location_env, local.export_env)
  }
}

# One job per phase, keyed by the phase:
# - "plan": list the Orbax step and write <destination>/step_XXXXXXXX/.orbax2reg/plan.json with the groups.
# - "convert-group", once per group (the workflow fans out with ORBAX2REG_GROUP and, optionally, taskCount
#   overrides): copy the group's chunks. The big one: 8 vCPU / 32 GiB by default, the Cloud Run maximum.
# - "finalize": check every planned object, then write the regular checkpoint's index (its commit marker).
# - "export-shards", only with hf_export: the export job. The workflow runs it for the export's three phases, giving
#   each execution its phase as an args override ("will replace existing args",
#   https://cloud.google.com/run/docs/reference/rest/v2/projects.locations.jobs/run#containeroverride; the task count
#   too: https://cloud.google.com/run/docs/execute/jobs-with-overrides). One job, not three: the phases share the
#   image, identity and size, and the workflow's runWithOverrides grant on it covers all three.
resource "google_cloud_run_v2_job" "phase" {
  for_each = local.jobs

  project             = var.project_id
  name                = each.value.name
  location            = var.region
  labels              = var.labels
  deletion_protection = var.deletion_protection

  template {
    task_count = 1

    template {
      service_account = google_service_account.jobs.email
      timeout         = var.task_timeout
      max_retries     = var.max_retries

      containers {
        image   = local.image
        command = ["node", "--max-semi-space-size=1", "--initial-old-space-size=64"] # as the image's ENTRYPOINT, which this replaces (Dockerfile)
        args    = ["dist/jobs/main.js", each.key]

        resources {
          limits = {
            cpu    = each.value.cpu
            memory = each.value.memory
          }
        }

        dynamic "env" {
          for_each = local.job_env[each.key]
          content {
            name  = env.key
            value = env.value
          }
        }
      }
    }
  }

  lifecycle {
    precondition {
      condition     = local.job_shape_ok[each.key]
      error_message = "${each.key} job: ${each.value.cpu_variable} = ${each.value.cpu} with ${each.value.memory_variable} = ${each.value.memory} do not fit Cloud Run jobs (1 vCPU takes 512Mi-4Gi, 2 vCPU 512Mi-8Gi, 4 vCPU 2Gi-16Gi, 6 vCPU 4Gi-24Gi, 8 vCPU 4Gi-32Gi)."
    }
  }

  # The image must exist before a job names it: Cloud Run resolves the tag when the job is created or updated.
  depends_on = [google_project_service.required, terraform_data.image_build]
}

# The jobs were three resources before (google_cloud_run_v2_job.plan, .convert_group and .finalize): these blocks move
# their state to the instances above, so a deployment made with them keeps its jobs (no destroy and create, which
# deletion_protection would refuse anyway).
# https://developer.hashicorp.com/terraform/language/modules/develop/refactoring
moved {
  from = google_cloud_run_v2_job.plan
  to   = google_cloud_run_v2_job.phase["plan"]
}

moved {
  from = google_cloud_run_v2_job.convert_group
  to   = google_cloud_run_v2_job.phase["convert-group"]
}

moved {
  from = google_cloud_run_v2_job.finalize
  to   = google_cloud_run_v2_job.phase["finalize"]
}
