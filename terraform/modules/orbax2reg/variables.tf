# ---------------------------------------------------------------------------------------------------------------------
# Where
# ---------------------------------------------------------------------------------------------------------------------

variable "project_id" {
  description = "Google Cloud project id that receives every resource of the pipeline (the checkpoint bucket must be in this project: Eventarc Cloud Storage triggers only watch buckets of their own project)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project_id))
    error_message = "project_id must be a project id (6-30 characters: lowercase letters, digits and hyphens, starting with a letter), not a project number or display name."
  }
}

variable "region" {
  description = "Region of the function, the workflow, the Cloud Run jobs and the Artifact Registry repository, e.g. us-central1."
  type        = string

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+$", var.region))
    error_message = "region must be a single Google Cloud region such as us-central1 or europe-west4 (multi-regions like \"us\" are only valid for trigger_region)."
  }
}

variable "name_prefix" {
  description = "Prefix of every resource name and service account id (function <prefix>-on-checkpoint, workflow <prefix>-convert, jobs <prefix>-plan / <prefix>-convert-group / <prefix>-finalize, service accounts <prefix>-fn / -trigger / -workflow / -jobs / -build / -imgbuild, bucket <project_id>-<prefix>-sources). Change it to deploy several independent pipelines in one project."
  type        = string
  default     = "orbax2reg"

  validation {
    # Service account ids are at most 30 characters and the longest suffix is "-workflow" (9).
    condition     = can(regex("^[a-z][a-z0-9-]{1,19}[a-z0-9]$", var.name_prefix))
    error_message = "name_prefix must be 3-21 characters of lowercase letters, digits and hyphens, start with a letter and not end with a hyphen."
  }
}

variable "labels" {
  description = "Labels added to every resource that supports them (function, workflow, jobs, topic, repository)."
  type        = map(string)
  default     = {}
}

variable "enable_apis" {
  description = "Enable the required Google APIs with google_project_service (never disabled on destroy). Set false when the project's APIs are managed elsewhere."
  type        = bool
  default     = true
}

variable "deletion_protection" {
  description = "Provider-side deletion protection of the workflow and the three Cloud Run jobs. While true, any plan that would destroy or replace them fails; set it to false and apply once before `terraform destroy` (see README)."
  type        = bool
  default     = true
}

variable "notification_channels" {
  description = "Cloud Monitoring notification channels to alert when a conversion fails (an execution of the workflow ends FAILED), as projects/<project>/notificationChannels/<id>. Also alerted: a checkpoint event the function dropped (its ERROR lines), and an event of its trigger left unacknowledged for event_backlog_alert_seconds. Empty (the default): no alert policy is created. See README, \"Failure alerts\"."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for c in var.notification_channels : can(regex("^projects/[^/]+/notificationChannels/[^/]+$", c))])
    error_message = "notification_channels entries must be projects/<project>/notificationChannels/<id> (gcloud beta monitoring channels list --format='value(name)')."
  }
}

variable "dashboard" {
  description = "Create a Cloud Monitoring dashboard of the deployment (conversions started, succeeded and failed, their duration, bytes written, events delivered, the trigger's backlog, job task attempts), and the three log-based metrics it charts. Off by default. See docs/operations.md, \"The dashboard\"."
  type        = bool
  default     = false
  nullable    = false
}

variable "event_backlog_alert_seconds" {
  description = "With notification_channels: alert when an event of the function's Eventarc trigger has waited this long without being acknowledged (the age of the oldest unacknowledged message of the trigger's Pub/Sub subscription). The metric is sampled every minute and visible up to 2 minutes later, so the default 600 alerts within about 13 minutes of the event. See README, \"Failure alerts\"."
  type        = number
  default     = 600
  nullable    = false

  validation {
    # Below 2 minutes a commit marker's own retries (10 s backoff, a claim busy for up to the function's timeout) would
    # alert; past 24 h Eventarc has discarded the event.
    condition     = var.event_backlog_alert_seconds >= 120 && var.event_backlog_alert_seconds < 86400
    error_message = "event_backlog_alert_seconds must be at least 120 and less than 86400 (Eventarc discards an event 24 h after it was sent)."
  }
}

variable "pubsub_agent_token_creator" {
  description = "Grant the project's Pub/Sub service agent (service-<number>@gcp-sa-pubsub.iam.gserviceaccount.com) Service Account Token Creator on the project. Only projects whose Pub/Sub service agent was created on or before 8 April 2021 need it, for the authenticated push Eventarc uses; leave false otherwise."
  type        = bool
  default     = false
  nullable    = false
}

# ---------------------------------------------------------------------------------------------------------------------
# Checkpoints in, regular checkpoints out
# ---------------------------------------------------------------------------------------------------------------------

variable "checkpoint_bucket" {
  description = "Name (no gs://) of the existing bucket the Orbax checkpoints are written to. The function is triggered by every object finalized in it."
  type        = string

  validation {
    condition = (
      can(regex("^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$", var.checkpoint_bucket)) &&
      (strcontains(var.checkpoint_bucket, ".") || length(var.checkpoint_bucket) <= 63) &&
      !startswith(var.checkpoint_bucket, "goog")
    )
    error_message = "checkpoint_bucket must be a bucket name without gs:// (3-63 lowercase letters, digits, '-', '_', '.'; up to 222 with dots; not starting with \"goog\")."
  }
}

variable "checkpoint_prefixes" {
  description = "Checkpoint roots to watch, as paths inside checkpoint_bucket: a checkpoint root (the directory holding step_XXXXXXXX) is watched when it equals an entry or lies under it, e.g. [\"runs\"] watches runs/exp1/checkpoints; leading/trailing '/' are ignored and [\"\"] watches the whole bucket. The function receives events for every object in the bucket (Cloud Storage triggers cannot filter by name) and dismisses the rest itself. Passed as ORBAX2REG_ROOT_PREFIXES, comma-separated."
  type        = list(string)
  default     = [""]

  validation {
    condition = length(var.checkpoint_prefixes) > 0 && alltrue([
      for p in var.checkpoint_prefixes : !startswith(p, "gs://") && !strcontains(p, ",")
    ])
    error_message = "checkpoint_prefixes needs at least one entry; entries are paths inside the bucket: no gs://, no ','."
  }
}

variable "destination_bucket" {
  description = "Bucket the regular checkpoints are written to; null means checkpoint_bucket. Must be the bucket named by destination_template (checked at plan time); the jobs may write there and in no other bucket. It must have uniform bucket-level access enabled (checked before the grants are made): the function may write only its claims there, through an IAM condition, and Cloud Storage honours IAM Conditions only on such buckets."
  type        = string
  default     = null

  validation {
    condition = var.destination_bucket == null ? true : (
      can(regex("^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$", var.destination_bucket)) &&
      (strcontains(var.destination_bucket, ".") || length(var.destination_bucket) <= 63) &&
      !startswith(var.destination_bucket, "goog")
    )
    error_message = "destination_bucket must be null or a bucket name without gs:// (3-63 lowercase letters, digits, '-', '_', '.'; up to 222 with dots)."
  }
}

variable "destination_template" {
  description = "Where a converted step goes, as a gs:// URL template (ORBAX2REG_DESTINATION_TEMPLATE). Placeholders: {bucket} = the bucket of the finalized commit marker (checkpoint_bucket), {root} = the checkpoint root, i.e. the object path of the directory holding the step_XXXXXXXX directories, without leading or trailing '/', {step} = the step directory name (step_00001000). Repeated '/' (an empty {root}) and a trailing '/' are dropped. The result is a destination root: the step is written to <destination>/step_XXXXXXXX/, so {step} is rarely needed. The jobs may write only there: in the checkpoint bucket the template must be gs://{bucket}/{root}/<dir> or gs://{bucket}/<dir>/{root} (an IAM condition on the object name keeps them off the source checkpoints; anything else is refused by a precondition), or name a separate destination_bucket."
  type        = string
  default     = "gs://{bucket}/{root}/regular"

  validation {
    condition = (
      can(regex("^gs://[^/]+(/.*)?$", var.destination_template)) &&
      !strcontains(replace(replace(replace(var.destination_template, "{bucket}", ""), "{root}", ""), "{step}", ""), "{") &&
      !strcontains(replace(replace(replace(var.destination_template, "{bucket}", ""), "{root}", ""), "{step}", ""), "}")
    )
    error_message = "destination_template must be a gs://bucket/path URL whose only placeholders are {bucket}, {root} and {step}."
  }
}

variable "groups" {
  description = "Number of groups the plan splits a checkpoint into (ORBAX2REG_GROUPS: the function passes it to the workflow, which also uses it when an execution started by hand names none). Each group is one execution of the convert-group job."
  type        = number
  default     = 8

  validation {
    condition     = var.groups >= 1 && var.groups <= 100 && floor(var.groups) == var.groups
    error_message = "groups must be an integer from 1 to 100 (every group costs a job execution and a container start; beyond ~100 that overhead dominates)."
  }
}

variable "max_parallel_groups" {
  description = "How many convert-group executions the workflow runs at once (ORBAX2REG_MAX_PARALLEL_GROUPS, the parallel step's concurrency_limit). Workflows runs at most 20 branches of one execution concurrently, so larger values buy nothing."
  type        = number
  default     = 8

  validation {
    condition     = var.max_parallel_groups >= 1 && var.max_parallel_groups <= 20 && floor(var.max_parallel_groups) == var.max_parallel_groups
    error_message = "max_parallel_groups must be an integer from 1 to 20 (the Workflows limit on concurrent branches per execution)."
  }
}

# ---------------------------------------------------------------------------------------------------------------------
# Step selection and retention (docs/events.md, "Step selection and retention")
# ---------------------------------------------------------------------------------------------------------------------

variable "convert_every_n_steps" {
  description = "Convert only steps whose number is divisible by this (ORBAX2REG_CONVERT_EVERY_N_STEPS on the function); other steps are ignored. Step numbers, not a count of checkpoints: with 1000, steps 1000, 2000, ... are converted. 1 converts every step."
  type        = number
  default     = 1
  nullable    = false

  validation {
    condition     = var.convert_every_n_steps >= 1 && var.convert_every_n_steps <= 99999999 && floor(var.convert_every_n_steps) == var.convert_every_n_steps
    error_message = "convert_every_n_steps must be an integer from 1 to 99999999 (AXLearn steps are at most 8 digits)."
  }
}

variable "keep_last_n" {
  description = "After each conversion, keep the newest N converted steps in the destination root and delete older ones not kept by keep_every_n_steps (ORBAX2REG_KEEP_LAST_N on the finalize job). Means what AXLearn's Checkpointer.Config.keep_last_n means for its garbage collection (axlearn/common/checkpointer.py). Only steps this tool converted (with its .orbax2reg/ record and an index) are counted or deleted, never the step just written. null or 0: this rule is off; with keep_every_n_steps also null, everything is kept (the default)."
  type        = number
  default     = null

  validation {
    condition     = var.keep_last_n == null ? true : try(var.keep_last_n >= 0 && var.keep_last_n <= 99999999 && floor(var.keep_last_n) == var.keep_last_n, false)
    error_message = "keep_last_n must be null or a non-negative integer."
  }
}

variable "keep_every_n_steps" {
  description = "Of the converted steps older than the keep_last_n newest, keep one at least every N steps and delete the rest (ORBAX2REG_KEEP_EVERY_N_STEPS on the finalize job), as AXLearn's Checkpointer.Config.keep_every_n_steps does (axlearn/common/checkpointer.py): walking oldest first, a step is kept when its number is at least N past the last one kept. Step numbers, not a count of checkpoints. null or 0: this rule is off."
  type        = number
  default     = null

  validation {
    condition     = var.keep_every_n_steps == null ? true : try(var.keep_every_n_steps >= 0 && var.keep_every_n_steps <= 99999999 && floor(var.keep_every_n_steps) == var.keep_every_n_steps, false)
    error_message = "keep_every_n_steps must be null or a non-negative integer."
  }
}

variable "hf_export" {
  description = <<-EOT
    Also export committed steps as Hugging Face Llama checkpoints (fuji models; what `orbax2reg export-hf` writes), fanned
    out over Cloud Run tasks. null (the default): no export, and no export job. Fields:
    - every_n_steps / steps: which steps (step numbers divisible by every_n_steps, and/or those listed). A step asked
      for both is converted (convert_every_n_steps) and then exported; a step asked only for the export is exported
      straight from its Orbax source and not converted.
    - destination_template: the export's folder per step, gs://{bucket}/{root}/hf/{step} style (placeholders as
      destination_template's; it must end in {step}, one folder per step). Its bucket must be checkpoint_bucket or
      destination_bucket; in the checkpoint bucket it must be gs://{bucket}/{root}/<dir>/{step} or
      gs://{bucket}/<dir>/.../{step}, where an IAM condition keeps the jobs off the source checkpoints.
    - dtype ("bfloat16" or "float32"), tokenizer (a gs:// file, "none", or null: the vocabulary's own), max_shard_size
      ("5GB" style), tasks (Cloud Run tasks of the export-shards execution; fewer when there are fewer shards).
    - keep_last_n / keep_every_n_steps: retention of the exports (AXLearn's rule, as keep_last_n / keep_every_n_steps),
      apart from the regular checkpoints'; null: keep every export.
    - tasks default 8, cpu / memory 1 vCPU / 1Gi each: docs/operations.md's figures (a task's peak RSS stays under
      512 MiB, and more vCPUs per task would not decode faster).
  EOT
  type = object({
    every_n_steps        = optional(number)
    steps                = optional(list(number), [])
    destination_template = string
    dtype                = optional(string, "bfloat16")
    tokenizer            = optional(string)
    max_shard_size       = optional(string, "5GB")
    tasks                = optional(number, 8)
    keep_last_n          = optional(number)
    keep_every_n_steps   = optional(number)
    cpu                  = optional(string, "1")
    memory               = optional(string, "1Gi")
  })
  default = null

  validation {
    condition     = var.hf_export == null ? true : (var.hf_export.every_n_steps != null || length(var.hf_export.steps) > 0)
    error_message = "hf_export needs every_n_steps or steps: which steps to export."
  }
  validation {
    condition = var.hf_export == null ? true : (
      (var.hf_export.every_n_steps == null ? true : try(var.hf_export.every_n_steps >= 1 && var.hf_export.every_n_steps <= 99999999 && floor(var.hf_export.every_n_steps) == var.hf_export.every_n_steps, false)) &&
      alltrue([for s in var.hf_export.steps : s >= 0 && s <= 99999999 && floor(s) == s])
    )
    error_message = "hf_export.every_n_steps must be an integer from 1 to 99999999, and hf_export.steps step numbers from 0 to 99999999."
  }
  validation {
    condition = var.hf_export == null ? true : (
      can(regex("^gs://[^/]+/.*\\{step\\}$", var.hf_export.destination_template)) &&
      !strcontains(replace(replace(replace(var.hf_export.destination_template, "{bucket}", ""), "{root}", ""), "{step}", ""), "{") &&
      !strcontains(replace(replace(replace(var.hf_export.destination_template, "{bucket}", ""), "{root}", ""), "{step}", ""), "}")
    )
    error_message = "hf_export.destination_template must be a gs://bucket/path URL ending in {step} whose only placeholders are {bucket}, {root} and {step}."
  }
  validation {
    condition     = var.hf_export == null ? true : contains(["bfloat16", "float32"], var.hf_export.dtype)
    error_message = "hf_export.dtype must be \"bfloat16\" or \"float32\"."
  }
  validation {
    condition     = var.hf_export == null ? true : (var.hf_export.tokenizer == null || var.hf_export.tokenizer == "none" || can(regex("^gs://[^/]+/.+", var.hf_export.tokenizer)))
    error_message = "hf_export.tokenizer must be null (the vocabulary's own), \"none\" or a gs://bucket/path file."
  }
  validation {
    condition     = var.hf_export == null ? true : can(regex("^[0-9]+(\\.[0-9]+)?\\s*([kKmMgGtT]i?[bB]|[bB]|bytes)?$", var.hf_export.max_shard_size))
    error_message = "hf_export.max_shard_size must be a size such as 5GB, 500MB, 2GiB or a number of bytes."
  }
  validation {
    condition     = var.hf_export == null ? true : (var.hf_export.tasks >= 1 && var.hf_export.tasks <= 10000 && floor(var.hf_export.tasks) == var.hf_export.tasks)
    error_message = "hf_export.tasks must be an integer from 1 to 10000 (Cloud Run's tasks per job execution)."
  }
  validation {
    condition = var.hf_export == null ? true : alltrue([
      for v in [var.hf_export.keep_last_n, var.hf_export.keep_every_n_steps] : v == null ? true : try(v >= 0 && v <= 99999999 && floor(v) == v, false)
    ])
    error_message = "hf_export.keep_last_n and hf_export.keep_every_n_steps must be null or non-negative integers."
  }
  validation {
    condition     = var.hf_export == null ? true : contains(["1", "2", "4", "6", "8"], var.hf_export.cpu) && can(regex("^[0-9]+(Mi|Gi)$", var.hf_export.memory))
    error_message = "hf_export.cpu must be one of \"1\", \"2\", \"4\", \"6\", \"8\" and hf_export.memory look like 512Mi or 2Gi."
  }
}

# ---------------------------------------------------------------------------------------------------------------------
# Cloud Function (2nd gen)
# ---------------------------------------------------------------------------------------------------------------------

variable "function_source_bucket" {
  description = "Only with function_source_object: the bucket holding that prebuilt source archive (e.g. one CI uploaded). null (the default): the module's own sources bucket, <project_id>-<name_prefix>-sources, which it creates and uploads the function's archive of the repository to."
  type        = string
  default     = null

  validation {
    condition = var.function_source_bucket == null ? true : (
      can(regex("^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$", var.function_source_bucket)) &&
      (strcontains(var.function_source_bucket, ".") || length(var.function_source_bucket) <= 63)
    )
    error_message = "function_source_bucket must be null or a bucket name without gs://."
  }
}

variable "function_source_object" {
  description = "Object name of a prebuilt source archive for the function (in function_source_bucket, else in the module's sources bucket), instead of the module's own archive of the repository. Name it by content (the function is rebuilt only when this name changes). null (the default): the module zips the function's sources itself and uploads them as orbax2reg/function-<identity>.zip."
  type        = string
  default     = null

  validation {
    condition     = var.function_source_object == null || try(endswith(var.function_source_object, ".zip") && !startswith(var.function_source_object, "/") && !startswith(var.function_source_object, "gs://"), false)
    error_message = "function_source_object must be an object name ending in .zip, without gs:// or a leading '/'."
  }
}

variable "function_build_service_account" {
  description = "Service account the function's Cloud Build runs as, as projects/<project>/serviceAccounts/<email>. null (the default) creates <name_prefix>-build with exactly what the build needs: Logs Writer on the project, Artifact Registry Writer on the module's function-build repository, Storage Object Admin on the function's staged source only (the roles https://cloud.google.com/run/docs/configuring/services/build-service-account lists). When given, the module creates and grants nothing for it: it needs those roles (or roles/cloudbuild.builds.builder) already. Whoever applies needs Service Account User (actAs) on it either way."
  type        = string
  default     = null

  validation {
    condition     = var.function_build_service_account == null ? true : can(regex("^projects/[^/]+/serviceAccounts/[^/]+@[^/]+$", var.function_build_service_account))
    error_message = "function_build_service_account must be null or projects/<project>/serviceAccounts/<email>."
  }
}

variable "function_memory" {
  description = "Memory of each function instance (the handler only filters names, claims the step and starts a workflow execution). With function_cpu it must be a pair Cloud Run allows (1 vCPU: 512Mi-4Gi, 2: 512Mi-8Gi, 4: 2Gi-16Gi, 6: 4Gi-24Gi, 8: 4Gi-32Gi; checked at plan time)."
  type        = string
  default     = "512Mi"

  validation {
    condition     = can(regex("^[0-9]+(M|Mi|G|Gi)$", var.function_memory))
    error_message = "function_memory must look like 512M, 512Mi or 1Gi."
  }
}

variable "function_cpu" {
  description = "vCPUs of each function instance (service_config.available_cpu: \"1\", \"2\", \"4\", \"6\" or \"8\"). At least 1, because a request concurrency above 1 needs a whole vCPU (https://cloud.google.com/functions/docs/configuring/concurrency). One vCPU dismisses the bucket's other events at the rate docs/operations.md, \"Event cost\", measures; more buys nothing for a Node.js handler, which runs on one thread."
  type        = string
  default     = "1"

  validation {
    condition     = contains(["1", "2", "4", "6", "8"], var.function_cpu)
    error_message = "function_cpu must be one of \"1\", \"2\", \"4\", \"6\", \"8\" (a concurrency above 1 needs at least one vCPU)."
  }
}

variable "function_concurrency" {
  description = "Events one function instance handles at once (service_config.max_instance_request_concurrency, 1 to 1000: https://cloud.google.com/run/docs/about-concurrency). Every object written to the bucket is one event, and almost all are dismissed by a name test in microseconds; at 1 (Cloud Run functions' default) each of them holds a whole instance for a round trip. See docs/operations.md, \"Event cost\"."
  type        = number
  default     = 80

  validation {
    condition     = var.function_concurrency >= 1 && var.function_concurrency <= 1000 && floor(var.function_concurrency) == var.function_concurrency
    error_message = "function_concurrency must be an integer from 1 to 1000 (Cloud Run's limit on concurrent requests per instance)."
  }
}

variable "function_timeout_seconds" {
  description = "Request timeout of the function in seconds (event-driven functions allow at most 540). The function's claim lease (ORBAX2REG_CLAIM_LEASE_SECONDS) is this plus 60: a claim left by a delivery that died may be taken over after that long."
  type        = number
  default     = 60

  validation {
    condition     = var.function_timeout_seconds >= 1 && var.function_timeout_seconds <= 540
    error_message = "function_timeout_seconds must be between 1 and 540."
  }
}

variable "function_max_instances" {
  description = "Upper bound on function instances. Every object written to the bucket is one event, so a checkpoint write is a burst; events refused while at the bound are retried by Eventarc, with a backoff of 10 s to 600 s, and Pub/Sub slows the whole subscription's delivery meanwhile, so a commit marker can wait behind them (the event_backlog alert hears of one left 10 minutes). With function_concurrency events at once per instance, 10 instances dismiss tens of thousands of events a second (docs/operations.md, \"Event cost\"); the function at its bound counts against the region's Cloud Run CPU and memory quota, as the jobs do."
  type        = number
  default     = 10

  validation {
    condition     = var.function_max_instances >= 1 && floor(var.function_max_instances) == var.function_max_instances
    error_message = "function_max_instances must be a positive integer."
  }
}

variable "trigger_region" {
  description = "Region of the Eventarc trigger; it must be the checkpoint bucket's location (e.g. us-central1, or us / eu / asia for multi-region buckets). null reads it from the bucket."
  type        = string
  default     = null

  validation {
    condition     = var.trigger_region == null ? true : can(regex("^[a-z][a-z0-9-]*[a-z0-9]$", var.trigger_region))
    error_message = "trigger_region must be null or a lowercase location: a region (us-central1) or a multi/dual-region (us, eu, asia, nam4, ...)."
  }
}

# ---------------------------------------------------------------------------------------------------------------------
# Workflow
# ---------------------------------------------------------------------------------------------------------------------

variable "workflow_source_path" {
  description = "Path of the workflow definition. null means the repository's workflows/convert.yaml (path.module/../../../workflows/convert.yaml). Read with file(), never templatefile(): the YAML's $${...} expressions need no escaping and all configuration arrives through user_env_vars."
  type        = string
  default     = null
}

variable "workflow_call_log_level" {
  description = "Workflows call logging level (an execution may override it)."
  type        = string
  default     = "LOG_ERRORS_ONLY"

  validation {
    condition     = contains(["CALL_LOG_LEVEL_UNSPECIFIED", "LOG_ALL_CALLS", "LOG_ERRORS_ONLY", "LOG_NONE"], var.workflow_call_log_level)
    error_message = "workflow_call_log_level must be one of CALL_LOG_LEVEL_UNSPECIFIED, LOG_ALL_CALLS, LOG_ERRORS_ONLY, LOG_NONE."
  }
}

variable "events_topic_name" {
  description = "Name of the Pub/Sub topic the function, the workflow and the finalize job publish conversion events to (conversion.requested, conversion.succeeded, conversion.failed, conversion.pruned; see docs/events.md)."
  type        = string
  default     = "orbax2reg-events"

  validation {
    condition     = can(regex("^[A-Za-z][A-Za-z0-9._~+%-]{2,254}$", var.events_topic_name)) && !startswith(lower(var.events_topic_name), "goog")
    error_message = "events_topic_name must be 3-255 characters, start with a letter, use letters, digits and - _ . ~ + %, and not start with \"goog\"."
  }
}

# ---------------------------------------------------------------------------------------------------------------------
# Cloud Run jobs and their image
# ---------------------------------------------------------------------------------------------------------------------

variable "artifact_repository_id" {
  description = "Id of the Artifact Registry Docker repository this module creates for the job image."
  type        = string
  default     = "orbax2reg"

  validation {
    condition     = can(regex("^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$", var.artifact_repository_id))
    error_message = "artifact_repository_id must be 1-63 lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "image" {
  description = "A pinned image for the three jobs (e.g. REGION-docker.pkg.dev/PROJECT/REPO/orbax2reg@sha256:...), built elsewhere; the jobs' account must be able to pull it. null (the default): the module builds the image from the repository's Dockerfile with Cloud Build (gcloud builds submit, run by terraform on the machine that applies) and tags it with its sources' identity."
  type        = string
  default     = null

  validation {
    condition     = var.image == null || try(length(var.image) > 0 && !strcontains(var.image, " "), false)
    error_message = "image must be null or an image reference such as us-docker.pkg.dev/my-project/images/orbax2reg@sha256:<digest>."
  }
}

variable "image_build_worker_pool" {
  description = "Cloud Build private pool the image is built in, as projects/<project>/locations/<region>/workerPools/<pool> (the build then runs in that region). null: Cloud Build's default pool in image_build_region. The build fetches the base image (image_build_node_image), Debian packages (the compilers of the zstd addon) and the npm packages of the lockfile: a pool without public egress (NO_PUBLIC_EGRESS) reaches none of them unless image_build_node_image, debian_mirror and npm_registry name copies it can reach (egressOption NO_PUBLIC_EGRESS: https://cloud.google.com/build/docs/api/reference/rest/v1/projects.locations.workerPools)."
  type        = string
  default     = null

  validation {
    condition     = var.image_build_worker_pool == null ? true : can(regex("^projects/[^/]+/locations/[^/]+/workerPools/[^/]+$", var.image_build_worker_pool))
    error_message = "image_build_worker_pool must be null or projects/<project>/locations/<region>/workerPools/<pool>."
  }
}

variable "image_build_region" {
  description = "Region of the image's Cloud Build run in Cloud Build's default pool (ignored with image_build_worker_pool, whose region the build runs in). null: region, when it is one of the regions where every project may run Cloud Build (us-central1, us-west2, europe-west1, asia-east1, australia-southeast1, southamerica-east1); for any other region the plan fails and asks for this to be set, since some projects may run Cloud Build only in those six (https://cloud.google.com/build/docs/locations, \"Restricted regions for some projects\"): set it to one of them, or to region itself when the project is known not to be restricted. The image is pushed to the repository in region either way."
  type        = string
  default     = null

  validation {
    condition     = var.image_build_region == null ? true : can(regex("^[a-z]+-[a-z]+[0-9]+$", var.image_build_region))
    error_message = "image_build_region must be null or a single Google Cloud region such as us-central1."
  }
}

variable "npm_registry" {
  description = "npm registry the builds install the lockfile's packages from (an Artifact Registry npm remote repository, a company mirror), as its https:// URL: the jobs' image build (the Dockerfile's NPM_REGISTRY) and the function's build (an .npmrc in its archive). null: npm's public registry. A worker pool without public egress needs it. The lockfiles record versions and integrity hashes but no download URLs (no \"resolved\" fields), so npm fetches every package from the configured registry and checks it against the lockfile's hash."
  type        = string
  default     = null

  validation {
    condition     = var.npm_registry == null ? true : can(regex("^https?://[^\\s,\"']+$", var.npm_registry))
    error_message = "npm_registry must be null or an http(s):// URL without spaces, commas or quotes."
  }
}

variable "debian_mirror" {
  description = "Debian archive the image build installs the addon's compilers from (the Dockerfile's DEBIAN_MIRROR), as a URL serving the same paths as Debian's own archive (<url>/debian and <url>/debian-security). null: the base image's own sources. A worker pool without public egress needs it."
  type        = string
  default     = null

  validation {
    condition     = var.debian_mirror == null ? true : can(regex("^https?://[^\\s,\"'#]+$", var.debian_mirror))
    error_message = "debian_mirror must be null or an http(s):// URL without spaces, commas, quotes or '#'."
  }
}

variable "function_build_worker_pool" {
  description = "Cloud Build private pool Cloud Functions builds the trigger function in (build_config.worker_pool), as projects/<project>/locations/<region>/workerPools/<pool>: what an organization policy requiring a worker pool for functions checks (resource.buildConfig.workerPool: https://cloud.google.com/functions/docs/securing/custom-constraints). null: Cloud Functions' default. The function's build fetches only npm packages (no install script of its dependencies downloads anything): a pool without public egress needs npm_registry."
  type        = string
  default     = null

  validation {
    condition     = var.function_build_worker_pool == null ? true : can(regex("^projects/[^/]+/locations/[^/]+/workerPools/[^/]+$", var.function_build_worker_pool))
    error_message = "function_build_worker_pool must be null or projects/<project>/locations/<region>/workerPools/<pool>."
  }
}

variable "image_versions_kept" {
  description = "Artifact Registry cleanup policies of the module's two repositories (the jobs' image, the function's builds): of each package, the newest this many versions are kept and older ones deleted once a day old. Every code change pushes a new image; without a policy they stay, and are billed, forever (https://cloud.google.com/artifact-registry/docs/repositories/cleanup-policy). Older images are rebuilt when needed: a version whose sources come back gets its tag again from a new build."
  type        = number
  default     = 5
  nullable    = false

  validation {
    condition     = var.image_versions_kept >= 1 && var.image_versions_kept <= 100 && floor(var.image_versions_kept) == var.image_versions_kept
    error_message = "image_versions_kept must be an integer from 1 to 100."
  }
}

variable "image_build_node_image" {
  description = "Base image of the jobs' image (the Dockerfile's NODE_IMAGE build argument, default node:22-bookworm-slim from Docker Hub). A builder that cannot reach Docker Hub names a copy of it, e.g. in an Artifact Registry remote repository. Part of the image's identity, as written: changing it rebuilds the image and redeploys the jobs, but a tag alone is never looked up again, so a base image updated under the same tag (security fixes) is not rebuilt into the jobs' image. Pin it by digest (node:22-bookworm-slim@sha256:<digest>) and move the digest to take an update."
  type        = string
  default     = "node:22-bookworm-slim"
  nullable    = false

  validation {
    condition     = can(regex("^[a-z0-9][A-Za-z0-9._/:@-]*$", var.image_build_node_image)) && !strcontains(var.image_build_node_image, ",")
    error_message = "image_build_node_image must be an image reference (letters, digits, . _ / : @ -), e.g. node:22-bookworm-slim."
  }
}

variable "image_build_service_account" {
  description = "Service account the image's Cloud Build run uses, as projects/<project>/serviceAccounts/<email>. null (the default) creates <name_prefix>-imgbuild with exactly what the build needs: Logs Writer on the project, Artifact Registry Writer on the jobs' image repository, Storage Object Viewer on the build contexts in the module's sources bucket. When given, the module grants it nothing. Whoever applies needs Service Account User (actAs) on it either way. Unused when image is set."
  type        = string
  default     = null

  validation {
    condition     = var.image_build_service_account == null ? true : can(regex("^projects/[^/]+/serviceAccounts/[^/]+@[^/]+$", var.image_build_service_account))
    error_message = "image_build_service_account must be null or projects/<project>/serviceAccounts/<email>."
  }
}

variable "group_cpu" {
  description = "vCPUs of each convert-group task (Cloud Run jobs: 1, 2, 4, 6 or 8)."
  type        = string
  default     = "8"

  validation {
    condition     = contains(["1", "2", "4", "6", "8"], var.group_cpu)
    error_message = "group_cpu must be one of \"1\", \"2\", \"4\", \"6\", \"8\"."
  }
}

variable "group_memory" {
  description = "Memory of each convert-group task (Cloud Run jobs: 512Mi to 32Gi; >4Gi needs 2 vCPU, >8Gi 4, >16Gi 6, >24Gi 8; and 4 vCPU need at least 2Gi, 6 or 8 vCPU 4Gi). The container filesystem is in memory too."
  type        = string
  default     = "32Gi"

  validation {
    # Cloud Run jobs take 512Mi to 32Gi (https://cloud.google.com/run/docs/configuring/jobs/memory-limits).
    condition     = can(regex("^[0-9]+(Mi|Gi)$", var.group_memory)) && try(tonumber(regex("^[0-9]+", var.group_memory)) * (endswith(var.group_memory, "Gi") ? 1024 : 1) >= 512 && tonumber(regex("^[0-9]+", var.group_memory)) * (endswith(var.group_memory, "Gi") ? 1024 : 1) <= 32768, false)
    error_message = "group_memory must look like 512Mi or 32Gi, from 512Mi to 32Gi."
  }
}

variable "plan_cpu" {
  description = "vCPUs of the plan task (1, 2, 4, 6 or 8)."
  type        = string
  default     = "2"

  validation {
    condition     = contains(["1", "2", "4", "6", "8"], var.plan_cpu)
    error_message = "plan_cpu must be one of \"1\", \"2\", \"4\", \"6\", \"8\"."
  }
}

variable "plan_memory" {
  description = "Memory of the plan task (same CPU/memory rules as group_memory)."
  type        = string
  default     = "8Gi"

  validation {
    # Cloud Run jobs take 512Mi to 32Gi (https://cloud.google.com/run/docs/configuring/jobs/memory-limits).
    condition     = can(regex("^[0-9]+(Mi|Gi)$", var.plan_memory)) && try(tonumber(regex("^[0-9]+", var.plan_memory)) * (endswith(var.plan_memory, "Gi") ? 1024 : 1) >= 512 && tonumber(regex("^[0-9]+", var.plan_memory)) * (endswith(var.plan_memory, "Gi") ? 1024 : 1) <= 32768, false)
    error_message = "plan_memory must look like 512Mi or 8Gi, from 512Mi to 32Gi."
  }
}

variable "finalize_cpu" {
  description = "vCPUs of the finalize task (1, 2, 4, 6 or 8)."
  type        = string
  default     = "2"

  validation {
    condition     = contains(["1", "2", "4", "6", "8"], var.finalize_cpu)
    error_message = "finalize_cpu must be one of \"1\", \"2\", \"4\", \"6\", \"8\"."
  }
}

variable "finalize_memory" {
  description = "Memory of the finalize task (same CPU/memory rules as group_memory)."
  type        = string
  default     = "8Gi"

  validation {
    # Cloud Run jobs take 512Mi to 32Gi (https://cloud.google.com/run/docs/configuring/jobs/memory-limits).
    condition     = can(regex("^[0-9]+(Mi|Gi)$", var.finalize_memory)) && try(tonumber(regex("^[0-9]+", var.finalize_memory)) * (endswith(var.finalize_memory, "Gi") ? 1024 : 1) >= 512 && tonumber(regex("^[0-9]+", var.finalize_memory)) * (endswith(var.finalize_memory, "Gi") ? 1024 : 1) <= 32768, false)
    error_message = "finalize_memory must look like 512Mi or 8Gi, from 512Mi to 32Gi."
  }
}

variable "task_timeout" {
  description = "Timeout of one attempt of one task, for all three jobs, as seconds with an 's' suffix (Cloud Run allows up to 168h = 604800s). The workflow's connector timeout must cover timeout x (max_retries + 1)."
  type        = string
  default     = "3600s"

  validation {
    condition     = can(regex("^[0-9]+s$", var.task_timeout)) && try(tonumber(trimsuffix(var.task_timeout, "s")) >= 1 && tonumber(trimsuffix(var.task_timeout, "s")) <= 604800, false)
    error_message = "task_timeout must be a duration in seconds like \"3600s\", between 1s and 604800s (168 hours)."
  }
}

variable "max_retries" {
  description = "Retries of a failed task before its execution fails (Cloud Run: 0-10). Only failures a retry may fix are retried: a task that fails permanently (bad input, damaged data) reports it to the workflow and exits 0, so it runs once."
  type        = number
  default     = 3

  validation {
    condition     = var.max_retries >= 0 && var.max_retries <= 10 && floor(var.max_retries) == var.max_retries
    error_message = "max_retries must be an integer from 0 to 10."
  }
}

variable "job_env" {
  description = "Extra environment variables for all three job containers (e.g. ORBAX2REG_MEMORY_MIB). The per-conversion variables (ORBAX2REG_ARGUMENT, ORBAX2REG_SOURCE, ORBAX2REG_STEP, ORBAX2REG_GROUP, ...) are set by the workflow as execution overrides and win over these; ORBAX2REG_PROJECT, ORBAX2REG_REGION and finalize's ORBAX2REG_EVENTS_TOPIC / ORBAX2REG_KEEP_* are set by the module and win too."
  type        = map(string)
  default     = {}
}
