// Where GcsStore's requests go and with which credentials: the endpoint (Google's, another of Google's, or an
// emulator's) and Application Default Credentials from google-auth-library, loaded on first use.
import { ConfigError } from "../../errors.js";
import { type Credentials, NO_CREDENTIALS } from "../http.js";

/**
 * What GcsStore takes from a client: the endpoint and the credentials (a @google-cloud/storage `Storage` is
 * one, as the tests pass it). Requests go through http.ts, retried by retry.ts, not through a client library.
 */
export interface GcsClient {
  readonly apiEndpoint: string;
  /** No credentials are sent (an emulator; as in the client library, unless told otherwise). */
  readonly customEndpoint: boolean;
  readonly authClient: { getRequestHeaders(): Promise<unknown>; refresh?(): Promise<void> };
}

let sharedClient: GcsClient | undefined;

/**
 * One client per process. Requests go to the JSON API at https://storage.googleapis.com with Application
 * Default Credentials (google-auth-library, loaded only then: @google-cloud/storage itself, ~30 MiB resident, is
 * not loaded at all), or to ORBAX2REG_GCS_ENDPOINT: a GCS emulator such as fake-gcs-server, or another endpoint
 * of Google's (Private Service Connect, a regional one). STORAGE_EMULATOR_HOST, the client library's variable,
 * names an emulator. Whether credentials are sent: see sendsCredentials.
 */
export function storageClient(): GcsClient {
  if (sharedClient !== undefined) return sharedClient;
  const endpoint = process.env.ORBAX2REG_GCS_ENDPOINT || undefined;
  const emulator = process.env.STORAGE_EMULATOR_HOST || undefined;
  const url = sanitizeEndpoint(endpoint ?? emulator ?? "https://storage.googleapis.com");
  const credentials = sendsCredentials(url, endpoint === undefined && emulator !== undefined, process.env.ORBAX2REG_GCS_AUTH);
  sharedClient = {
    apiEndpoint: url,
    customEndpoint: !credentials,
    authClient: credentials ? lazyAuth() : { getRequestHeaders: async () => ({}) },
  };
  return sharedClient;
}

/**
 * Whether requests to `url` carry a bearer token. ORBAX2REG_GCS_AUTH says so outright ("adc" or "none");
 * otherwise an emulator gets none (STORAGE_EMULATOR_HOST, or an endpoint over plain http:// or on loopback, as
 * every GCS emulator is) and any other endpoint gets Application Default Credentials, since it is Google's.
 */
export function sendsCredentials(url: string, emulatorVariable: boolean, setting: string | undefined): boolean {
  if (setting !== undefined && setting !== "") {
    if (setting === "adc") return true;
    if (setting === "none") return false;
    throw new ConfigError("ORBAX2REG_GCS_AUTH", setting, 'expected "adc" (Application Default Credentials) or "none"');
  }
  if (emulatorVariable) return false;
  const u = new URL(url);
  if (u.protocol === "http:") return false;
  const host = u.hostname.replace(/^\[|\]$/g, "");
  return !(host === "localhost" || host === "::1" || /^127\./.test(host));
}

/** What every request of `client` is sent with: nothing for an emulator, else its token, renewed after a 401. */
export function credentialsOf(client: GcsClient): Credentials {
  if (client.customEndpoint) return NO_CREDENTIALS;
  const auth = client.authClient;
  return {
    headers: async () => headerRecord(await auth.getRequestHeaders()),
    refresh: async () => auth.refresh?.(),
  };
}

/** As the client library takes an endpoint: https:// unless it names a scheme, no trailing slash. */
const sanitizeEndpoint = (url: string) => (/^\w+:\/\//.test(url) ? url : `https://${url}`).replace(/\/+$/, "");

/** Application Default Credentials, google-auth-library loaded on the first request that needs them. */
function lazyAuth(): GcsClient["authClient"] {
  type Auth = { getRequestHeaders(): Promise<unknown>; getClient(): Promise<unknown> };
  let auth: Promise<Auth> | undefined;
  const load = () =>
    (auth ??= import("google-auth-library").then(
      ({ GoogleAuth }) =>
        new GoogleAuth({
          scopes: ["https://www.googleapis.com/auth/cloud-platform", "https://www.googleapis.com/auth/devstorage.full_control"],
        }),
    ));
  return {
    getRequestHeaders: async () => (await load()).getRequestHeaders(),
    // A token the server refused (revoked, or its clock ahead of ours): OAuth2 clients renew on demand; a client
    // without refreshAccessToken renews when its token nears expiry, as it would anyway.
    refresh: async () => {
      const client = (await (await load()).getClient()) as { refreshAccessToken?: () => Promise<unknown> };
      if (typeof client.refreshAccessToken === "function") await client.refreshAccessToken();
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
