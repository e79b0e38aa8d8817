// Where GcsStore's requests go and with which credentials: the endpoint (Google's, or an emulator's) and
// Application Default Credentials from google-auth-library, loaded on first use.

/**
 * What GcsStore takes from a client: the endpoint and the credentials (a @google-cloud/storage `Storage` is
 * one, as the tests pass it). Requests go through http.ts, retried by retry.ts, not through a client library.
 */
export interface GcsClient {
  readonly apiEndpoint: string;
  /** An emulator: no credentials are sent (as in the client library, unless told otherwise). */
  readonly customEndpoint: boolean;
  readonly authClient: { getRequestHeaders(): Promise<unknown> };
}

let sharedClient: GcsClient | undefined;

/**
 * One client per process. ORBAX2REG_GCS_ENDPOINT (e.g. http://127.0.0.1:4443) points it at a GCS emulator
 * such as fake-gcs-server (STORAGE_EMULATOR_HOST, the client library's variable, too). Otherwise the JSON
 * API at https://storage.googleapis.com, with Application Default Credentials from google-auth-library,
 * loaded only then: @google-cloud/storage itself, ~30 MiB resident, is not loaded at all.
 */
export function storageClient(): GcsClient {
  const endpoint = process.env.ORBAX2REG_GCS_ENDPOINT || process.env.STORAGE_EMULATOR_HOST;
  sharedClient ??= endpoint
    ? { apiEndpoint: sanitizeEndpoint(endpoint), customEndpoint: true, authClient: { getRequestHeaders: async () => ({}) } }
    : { apiEndpoint: "https://storage.googleapis.com", customEndpoint: false, authClient: lazyAuth() };
  return sharedClient;
}

/** The headers every request of `client` carries: none for an emulator (as in the library, unless told otherwise). */
export function authHeaders(client: GcsClient): () => Promise<Record<string, string>> {
  return client.customEndpoint ? async () => ({}) : async () => headerRecord(await client.authClient.getRequestHeaders());
}

/** As the client library takes an endpoint: https:// unless it names a scheme, no trailing slash. */
const sanitizeEndpoint = (url: string) => (/^\w+:\/\//.test(url) ? url : `https://${url}`).replace(/\/+$/, "");

/** Application Default Credentials, google-auth-library loaded on the first request that needs them. */
function lazyAuth(): GcsClient["authClient"] {
  let auth: Promise<{ getRequestHeaders(): Promise<unknown> }> | undefined;
  return {
    getRequestHeaders: async () => {
      auth ??= import("google-auth-library").then(
        ({ GoogleAuth }) =>
          new GoogleAuth({
            scopes: ["https://www.googleapis.com/auth/cloud-platform", "https://www.googleapis.com/auth/devstorage.full_control"],
          }),
      );
      return (await auth).getRequestHeaders();
    },
  };
}

/**
 * google-auth-library 9 (what @google-cloud/storage 7 bundles, in the tests' clients) returns request headers
 * as a plain object, version 10 (ours) as a fetch `Headers`: accept both, so an upgrade cannot silently drop the Authorization header.
 */
function headerRecord(h: unknown): Record<string, string> {
  const out: Record<string, string> = {};
  if (h && typeof (h as Headers).forEach === "function")
    (h as Headers).forEach((v, k) => {
      out[k] = v;
    });
  else for (const [k, v] of Object.entries((h ?? {}) as Record<string, unknown>)) out[k] = String(v);
  return out;
}
