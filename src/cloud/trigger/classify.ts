import { parseStepName, stepDirName, TMP_MARK } from "../../orbax/step-name.js";

/**
 * Which GCS finalize events start a conversion. A training bucket produces many events per step (every
 * chunk, every item marker), so most must be dismissed by a cheap string test before any regex or I/O.
 */
export interface TriggerConfig {
  /** Checkpoint roots to watch, as object-name prefixes inside the bucket ("" watches the whole bucket). */
  readonly rootPrefixes: readonly string[];
  /** Destination root for a step; placeholders {bucket}, {root} (the checkpoint root) and {step}. */
  readonly destinationTemplate: string;
  /**
   * Convert only steps divisible by this (terraform convert_every_n_steps; undefined or 1: every step).
   * Step numbers, not a count of checkpoints: with 1000 and steps saved every 500, step 1500 is skipped.
   */
  readonly convertEveryNSteps?: number;
  /** Which steps are also (or only) exported as Hugging Face checkpoints, and where (terraform hf_export). */
  readonly export?: ExportSelection;
}

/** The export's step selection and destination (the rest of its settings go into the argument as they are). */
export interface ExportSelection {
  /** Steps divisible by this are exported; undefined: none by this rule. */
  readonly everyNSteps?: number;
  /** These steps are exported. */
  readonly steps: readonly number[];
  /** The export's folder for a step: placeholders {bucket}, {root}, {step}, as destinationTemplate's. */
  readonly destinationTemplate: string;
}

export type TriggerDecision =
  | { readonly kind: "ignore"; readonly reason: string }
  | {
      readonly kind: "convert";
      readonly layout: "axlearn" | "emergency";
      readonly step: number;
      /** Orbax step to convert (for the emergency layout, its tensors/step_X). */
      readonly source: string;
      readonly destination: string;
      /** Whether the step is converted (false: asked for the export only). */
      readonly convert: boolean;
      /** The export's folder when the step is exported. */
      readonly exportTo?: string;
      /**
       * For the emergency layout, the other half that must also exist before converting (the event that
       * arrives second starts the conversion; the claim keeps it to one).
       */
      readonly requires?: { readonly bucket: string; readonly name: string };
    };

const COMMIT = "/commit_success.txt";

/**
 * `orbax2reg cloud check` uploads its example step under `<prefix>/orbax2reg-check-<8 hex>/`: a step there proves
 * the pipeline, so it is converted whatever convert_every_n_steps says (the example is step 100) and never exported
 * by the hf_export rules (the example is no fuji model; the check runs its export as a run of its own).
 */
export const CHECK_ROOT_PREFIX = "orbax2reg-check-";
const CHECK_ROOT = /(^|\/)orbax2reg-check-[0-9a-f]{8}$/;
const INDEX = "/index";

/** Classifies one finalized object. Pure: no I/O. */
export function classify(bucket: string, name: string, config: TriggerConfig): TriggerDecision {
  // Fast path: only two object names can ever matter.
  if (!name.endsWith(COMMIT) && !name.endsWith(INDEX)) return { kind: "ignore", reason: "not a commit marker" };
  if (name.includes(TMP_MARK)) return { kind: "ignore", reason: "temporary directory" };
  const parts = name.split("/");
  const file = parts.pop() as string;
  const stepName = parts.pop();
  const n = stepName === undefined ? undefined : parseStepName(stepName);
  if (n === undefined)
    return { kind: "ignore", reason: "not directly inside a step_XXXXXXXX directory (an item-level marker or other file)" };
  const parent = parts.join("/");
  const emergencyKind = parts[parts.length - 1];
  const isEmergency =
    (file === "commit_success.txt" && emergencyKind === "tensors") || (file === "index" && emergencyKind === "non-tensors");
  if (file === "index" && !isEmergency) return { kind: "ignore", reason: "an index outside non-tensors/" };
  const root = isEmergency ? parts.slice(0, -1).join("/") : parent;
  if (!watched(root, config.rootPrefixes)) return { kind: "ignore", reason: "outside the watched checkpoint roots" };
  const check = CHECK_ROOT.test(root);
  const every = config.convertEveryNSteps ?? 1;
  const convert = check || every <= 1 || n % every === 0;
  const ex = check ? undefined : config.export;
  const exported = ex !== undefined && (ex.steps.includes(n) || (ex.everyNSteps !== undefined && n % ex.everyNSteps === 0));
  if (!convert && !exported)
    return {
      kind: "ignore",
      reason: `step ${n} is not a multiple of convert_every_n_steps (${every})${ex ? " and not a step hf_export asks for" : ""}`,
    };
  const at = (path: string) => (path === "" ? `gs://${bucket}` : `gs://${bucket}/${path}`);
  const values = { bucket, root, step: stepDirName(n) };
  const destination = expand(config.destinationTemplate, values);
  const asked = { convert, ...(exported ? { exportTo: expand(ex.destinationTemplate, values) } : {}) };
  const prefix = root === "" ? "" : `${root}/`;
  if (!isEmergency) return { kind: "convert", layout: "axlearn", step: n, source: at(`${prefix}${stepName}`), destination, ...asked };
  const other = file === "index" ? `${prefix}tensors/${stepName}/commit_success.txt` : `${prefix}non-tensors/${stepName}/index`;
  return {
    kind: "convert",
    layout: "emergency",
    step: n,
    source: at(`${prefix}tensors/${stepName}`),
    destination,
    ...asked,
    requires: { bucket, name: other },
  };
}

function watched(root: string, prefixes: readonly string[]): boolean {
  return prefixes.some((p) => {
    const prefix = p.replace(/^\/+|\/+$/g, "");
    return prefix === "" || root === prefix || root.startsWith(`${prefix}/`);
  });
}

export function expand(template: string, values: { bucket: string; root: string; step: string }): string {
  return template
    .replaceAll("{bucket}", values.bucket)
    .replaceAll("{root}", values.root)
    .replaceAll("{step}", values.step)
    .replace(/([^:])\/{2,}/g, "$1/")
    .replace(/\/+$/, "");
}
