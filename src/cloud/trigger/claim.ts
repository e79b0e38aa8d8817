import { CLAIM_KEY, type ClaimRecord } from "../../convert/work-dir.js";
import { UsageError } from "../../errors.js";
import { describe, joinKey, type Store, type VersionedObjects } from "../../store/store.js";

/**
 * The once-per-step claim: `<destination>/step_XXXXXXXX/.orbax2reg/claim.json`, created only if absent.
 * It is a lease with a recorded state. While it records no execution, it protects the step for
 * `leaseMs` from its `claimedAt`; after that a later delivery may take it over. The delivery that wrote it
 * is not necessarily dead then (a throttled function instance runs on past its timeout), so whoever holds a
 * claim starts an execution only before its own deadline and only while the claim is still at the version
 * it wrote, and settles the claim after the call (src/cloud/trigger/start.ts). Once it names an execution, the step
 * is done for the trigger: deleting the claim allows a new automatic run. Its key and record (ClaimRecord) are
 * in src/convert/work-dir.ts.
 */
export type ClaimState =
  | { readonly kind: "absent" }
  | { readonly kind: "pending"; readonly record: ClaimRecord; readonly version: string; readonly expired: boolean }
  | { readonly kind: "started"; readonly record: ClaimRecord; readonly version: string };

export class StepClaim {
  readonly key: string;
  private readonly objects: VersionedObjects;

  constructor(
    private readonly store: Store,
    stepDir: string,
    private readonly leaseMs: number,
    private readonly now: () => number = Date.now,
  ) {
    this.key = joinKey(stepDir, CLAIM_KEY);
    if (!store.versioned) throw new UsageError("claims need a store with versioned writes (gs://)", { path: store.url });
    this.objects = store.versioned;
  }

  /** Where the claim lives, for messages. */
  get url(): string {
    return describe(this.store, this.key);
  }

  async read(): Promise<ClaimState> {
    const current = await this.objects.get(this.key);
    if (current === undefined) return { kind: "absent" };
    const record = parseRecord(current.data);
    if (record.execution) return { kind: "started", record, version: current.version };
    const age = this.now() - Date.parse(record.claimedAt);
    // An unreadable time counts as expired: a claim nobody can date protects nothing.
    return { kind: "pending", record, version: current.version, expired: !(age < this.leaseMs) };
  }

  /** Creates the claim; its version, or undefined when someone else holds one. */
  create(record: ClaimRecord): Promise<string | undefined> {
    return this.objects.create(this.key, encode(record));
  }

  /** Replaces the claim at `version` (a takeover, or recording the execution); undefined when it moved on. */
  replace(version: string, record: ClaimRecord): Promise<string | undefined> {
    return this.objects.replace(this.key, encode(record), version);
  }

  /** Deletes the claim if it is still at `version`. */
  release(version: string): Promise<boolean> {
    return this.objects.delete(this.key, version);
  }
}

function parseRecord(data: Uint8Array): ClaimRecord {
  try {
    const v = JSON.parse(new TextDecoder().decode(data)) as Partial<ClaimRecord>;
    return {
      source: String(v.source ?? ""),
      step: Number(v.step ?? -1),
      eventId: v.eventId ?? null,
      claimedAt: String(v.claimedAt ?? ""),
      execution: typeof v.execution === "string" && v.execution !== "" ? v.execution : null,
    };
  } catch {
    // A damaged claim is a pending one nobody can date: the next delivery takes it over.
    return { source: "", step: -1, eventId: null, claimedAt: "", execution: null };
  }
}

function encode(record: ClaimRecord): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(record));
}
