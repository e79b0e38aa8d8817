// Requests to the GCS JSON API (https://cloud.google.com/storage/docs/json_api/v1/objects) for one bucket:
// where each goes, what its statuses mean, and the one retry loop (retry.ts's policy) every GcsStore
// operation runs in. What the bytes mean (uploads, ranges, listings) is the callers'.
import { DestinationError, NotFoundError } from "../../errors.js";
import type { Answer, Http, SendInit } from "../http.js";
import { type AGAIN, type Attempts, type RetryPolicy, retrying, retryingStream } from "../retry.js";

/** The fields of an object resource this tool reads. */
export interface ObjectResource {
  name: string;
  size?: string;
  crc32c?: string;
  generation?: string;
}

/** One request, as GcsStore asks for it. */
export interface GcsRequest {
  readonly method: "GET" | "POST" | "PUT" | "DELETE";
  /** An object by name, the bucket itself, the bucket's objects (a listing), an upload, or a resumable upload session's URI. */
  readonly to: { readonly object: string } | "bucket" | "objects" | "upload" | { readonly session: string };
  readonly query?: Readonly<Record<string, string>>;
  readonly headers?: Readonly<Record<string, string>>;
  /** A streamed body is made afresh for each attempt (a stream is read once). */
  readonly body?: Uint8Array | (() => AsyncIterable<Uint8Array>);
  /** Statuses the caller handles; any other is an error (http.ts: transient as retry.ts's transientStatus() says, or final). */
  readonly accept: readonly number[];
  /**
   * What a 404 the caller does not handle means: no such object (NotFoundError), or, for a request on the
   * bucket itself (a listing, an upload), no such bucket (DestinationError: the user fixes it there; a
   * NotFoundError naming the bucket when the store is an input).
   */
  readonly missing?: "object" | "bucket";
  /** The object (store URL + key), for messages. */
  readonly path: string;
}

/** The fields of a bucket resource this tool reads (https://cloud.google.com/storage/docs/json_api/v1/buckets). */
export interface BucketResource {
  iamConfiguration?: { uniformBucketLevelAccess?: { enabled?: boolean } };
}

export class JsonApi {
  private readonly bucketName: string;
  private readonly bucket: string;
  private readonly objects: string;
  private readonly uploads: string;

  constructor(
    endpoint: string,
    bucket: string,
    private readonly http: Http,
    private readonly policy: RetryPolicy,
    /** What the store is to the command (GcsOptions.role): what a missing bucket means. */
    private readonly role: "input" | "destination" = "destination",
  ) {
    this.bucketName = bucket;
    const base = endpoint.replace(/\/+$/, "");
    this.bucket = `${base}/storage/v1/b/${encodeURIComponent(bucket)}`;
    this.objects = `${base}/storage/v1/b/${encodeURIComponent(bucket)}/o`;
    this.uploads = `${base}/upload/storage/v1/b/${encodeURIComponent(bucket)}/o`;
  }

  url(to: GcsRequest["to"], query: Readonly<Record<string, string>> = {}): string {
    const base =
      to === "bucket"
        ? this.bucket
        : to === "objects"
          ? this.objects
          : to === "upload"
            ? this.uploads
            : "object" in to
              ? `${this.objects}/${encodeURIComponent(to.object)}`
              : to.session;
    const q = new URLSearchParams(query).toString();
    return q ? `${base}?${q}` : base;
  }

  /** One attempt of `req` (to `url`, if built already): its answer, when its status is one the caller handles. */
  async send(req: GcsRequest, url = this.url(req.to, req.query)): Promise<Answer> {
    const init: SendInit = {
      ...(req.headers ? { headers: req.headers } : {}),
      ...(req.body !== undefined ? { body: typeof req.body === "function" ? req.body() : req.body } : {}),
      accept: req.missing && !req.accept.includes(404) ? [...req.accept, 404] : req.accept,
      path: req.path,
    };
    const a = await this.http.send(req.method, url, init);
    if (a.status === 404 && req.missing && !req.accept.includes(404)) {
      if (req.missing === "bucket") return noSuchBucket(a, req.path, this.role === "input" ? this.bucketName : undefined);
      await a.discard();
      throw new NotFoundError("no such object", { path: req.path });
    }
    return a;
  }

  /**
   * `req` until `handle` takes its answer, retried as retry.ts says (`what` names it in notices and in the
   * give-up message). `handle` runs inside the attempt: what it throws is retried or not by the same rule.
   */
  request<T>(what: string, req: GcsRequest, handle: (a: Answer, r: Attempts) => Promise<T | typeof AGAIN>): Promise<T> {
    const url = this.url(req.to, req.query);
    return retrying(what, req.path, this.policy, async (r) => handle(await this.send(req, url), r));
  }

  /** An operation of several requests (or one that varies between attempts), retried as one. */
  retrying<T>(what: string, path: string, attempt: (r: Attempts) => Promise<T | typeof AGAIN>): Promise<T> {
    return retrying(what, path, this.policy, attempt);
  }

  retryingStream<T>(what: string, path: string, attempt: (r: Attempts) => AsyncGenerator<T>): AsyncGenerator<T> {
    return retryingStream(what, path, this.policy, attempt);
  }

  /** The object resource (size, crc32c, generation), or undefined if there is no object. */
  resource(name: string, path: string): Promise<ObjectResource | undefined> {
    return this.request("metadata request", { method: "GET", to: { object: name }, accept: [200, 404], path }, async (a) => {
      if (a.status === 404) return void (await a.discard());
      return a.json<ObjectResource>();
    });
  }

  /** The bucket's resource, only the fields named (buckets.get; needs storage.buckets.get). */
  bucketResource(fields: string, path: string): Promise<BucketResource> {
    const req: GcsRequest = { method: "GET", to: "bucket", query: { fields }, accept: [200], missing: "bucket", path };
    return this.request("bucket metadata request", req, async (a) => a.json<BucketResource>());
  }

  /** Deletes generation `version` of the object; false if the object has another (or none). */
  deleteIf(name: string, path: string, version: string): Promise<boolean> {
    const req: GcsRequest = {
      method: "DELETE",
      to: { object: name },
      query: { ifGenerationMatch: version },
      accept: [200, 204, 404, 412],
      path,
    };
    return this.request("delete", req, async (a, r) => {
      await a.discard();
      // A 404 after a lost answer is most likely our own delete having happened.
      return a.status === 200 || a.status === 204 || (a.status === 404 && r.retried);
    });
  }
}

/**
 * A 404 to a request on the bucket itself (a listing, an upload's start): the bucket does not exist, which
 * the user fixes at the destination; or, for an input (`inputBucket`, its name), bad input naming the bucket.
 * Named with GCS's own words, as any other refused request is.
 */
async function noSuchBucket(a: Answer, path: string, inputBucket?: string): Promise<never> {
  const text = new TextDecoder().decode(await a.bytes().catch(() => new Uint8Array()));
  let message = text.slice(0, 300);
  try {
    const m = (JSON.parse(text) as { error?: { message?: unknown } }).error?.message;
    if (m !== undefined && m !== null) message = typeof m === "string" ? m : JSON.stringify(m);
  } catch {
    // not JSON: keep the text
  }
  message = message.replace(/\s+/g, " ").trim();
  if (inputBucket !== undefined) {
    throw new NotFoundError(`the bucket gs://${inputBucket} does not exist (HTTP 404${message ? ` (${message})` : ""})`, { path });
  }
  throw new DestinationError(`no such bucket (HTTP 404${message ? ` (${message})` : ""})`, { path });
}

/** GCS's crc32c metadata: base64 of the big-endian CRC-32C (https://cloud.google.com/storage/docs/json_api/v1/objects). */
export function storedCrc(base64: string | undefined): { crc32c?: number } {
  if (!base64) return {};
  const b = Buffer.from(base64, "base64");
  return b.length === 4 ? { crc32c: b.readUInt32BE(0) } : {};
}

export function crcBase64(value: number): string {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(value >>> 0, 0);
  return b.toString("base64");
}

/** The crc32c in an X-Goog-Hash header ("crc32c=...,md5=..."), which GCS sends with every download. */
export function hashHeader(headers: Headers): number | undefined {
  const m = /crc32c=([A-Za-z0-9+/=]+)/.exec(headers.get("x-goog-hash") ?? "");
  return m ? storedCrc(m[1]).crc32c : undefined;
}
