/**
 * Every default orbax2reg has, in one place: the library's and the CLI's on one machine, the Cloud Run jobs'
 * (they run alone on a big machine, so they default higher), and the deployment's, which are terraform's
 * (terraform/modules/orbax2reg/variables.tf; test/defaults.test.ts checks them against it). A module of its own,
 * importing nothing, so the CLI reads it without loading the engine.
 */

// ---- One machine: the library and the CLI ---------------------------------------------------------------------

/** Objects in flight. */
export const DEFAULT_CONCURRENCY = 16;
/** The bound on bytes buffered at once (MiB). */
export const DEFAULT_MEMORY_MIB = 256;
/** Parameter groups a plan has unless told: one machine converts them all (`orbax2reg convert`, a job run by hand). */
export const DEFAULT_PLAN_GROUPS = 1;

/** Upper bounds for settings read from the environment: they only reject nonsense. */
export const MAX_CONCURRENCY = 65_536;
export const MAX_MEMORY_MIB = 16 * 1024 * 1024;

/** MiB to bytes. Not `<< 20`: that wraps at 2048 MiB (32-bit), giving a negative or zero budget. */
export const mibToBytes = (mib: number): number => mib * 2 ** 20;

// ---- The Cloud Run jobs ---------------------------------------------------------------------------------------

/** ORBAX2REG_CONCURRENCY when unset. */
export const JOB_CONCURRENCY = 32;
/** ORBAX2REG_MEMORY_MIB when unset. */
export const JOB_MEMORY_MIB = 1024;

// ---- The deployment (terraform/modules/orbax2reg's variables) ---------------------------------------------------

/** var.groups: parameter groups a conversion is split into (ORBAX2REG_GROUPS). */
export const DEFAULT_GROUPS = 8;
/** var.groups' upper bound: every group costs a job execution and a container start. */
export const MAX_GROUPS = 100;
/** var.max_parallel_groups: convert-group executions the workflow runs at once (ORBAX2REG_MAX_PARALLEL_GROUPS). */
export const DEFAULT_MAX_PARALLEL_GROUPS = 8;
/** var.group_cpu and var.group_memory: one convert-group task (`orbax2reg cloud check` weighs them against the quota). */
export const DEFAULT_GROUP_CPU = "8";
export const DEFAULT_GROUP_MEMORY = "32Gi";
/** var.function_max_instances, var.function_cpu and var.function_memory (the quota stage adds the function at its bound). */
export const DEFAULT_FUNCTION_MAX_INSTANCES = 10;
export const DEFAULT_FUNCTION_CPU = "1";
export const DEFAULT_FUNCTION_MEMORY = "512Mi";
/** var.destination_template: placeholders {bucket}, {root}, {step} (src/cloud/trigger/classify.ts, expand). */
export const DEFAULT_DESTINATION_TEMPLATE = "gs://{bucket}/{root}/regular";
/** var.convert_every_n_steps: only steps divisible by this are converted (1: every step). */
export const DEFAULT_CONVERT_EVERY_N_STEPS = 1;
/** var.name_prefix. */
export const DEFAULT_NAME_PREFIX = "orbax2reg";
/** The workflow's name with the default prefix (main.tf: "${var.name_prefix}-convert"). */
export const DEFAULT_WORKFLOW_NAME = `${DEFAULT_NAME_PREFIX}-convert`;
/** A full workflow id, as ORBAX2REG_WORKFLOW and terraform's workflow_id output spell it. */
export const FULL_WORKFLOW_ID = /^projects\/[^/]+\/locations\/[^/]+\/workflows\/[^/]+$/;

/** var.function_timeout_seconds. */
export const DEFAULT_FUNCTION_TIMEOUT_SECONDS = 60;
/** The longest timeout an event-driven function may have (var.function_timeout_seconds' bound). */
export const MAX_FUNCTION_TIMEOUT_SECONDS = 540;
/** How much longer than the function's timeout its claim lease is (function.tf: function_timeout_seconds + 60). */
export const CLAIM_LEASE_MARGIN_SECONDS = 60;
/** The lease the deployed function uses with terraform's defaults (ORBAX2REG_CLAIM_LEASE_SECONDS). */
export const DEFAULT_CLAIM_LEASE_SECONDS = DEFAULT_FUNCTION_TIMEOUT_SECONDS + CLAIM_LEASE_MARGIN_SECONDS;
/**
 * The lease to assume when the deployment's is not known: no deployment's is longer, so a claim is never taken
 * over while its delivery may still start an execution.
 */
export const LONGEST_CLAIM_LEASE_SECONDS = MAX_FUNCTION_TIMEOUT_SECONDS + CLAIM_LEASE_MARGIN_SECONDS;

/**
 * The pipeline's export tasks when neither the argument nor terraform's hf_export.tasks says: docs/operations.md's
 * proposal from the fan-out's measured figures (fuji-7B-v2 ~4 -> ~1.5 min, fuji-70B ~38 -> ~7 min); the export's
 * plan may use fewer.
 */
export const DEFAULT_EXPORT_TASKS = 8;
