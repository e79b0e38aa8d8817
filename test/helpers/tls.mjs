// TLS for the tests' and the benchmarks' GCS emulators, as every real request to Cloud Storage is HTTPS: a private
// test CA and a certificate it signs for loopback (127.0.0.1, ::1 and localhost), made once with the openssl CLI
// into test/.generated/tls/ (git-ignored), and trusted by every node process the tests start through
// NODE_EXTRA_CA_CERTS, which node reads once, at its start (https://nodejs.org/api/cli.html#node_extra_ca_certsfile):
// it must be in a process's environment before it starts. Plain JavaScript, so that the benchmarks (bench/*.mjs)
// use the same module as the vitest setup; its types are in tls.d.mts.
import { spawn, spawnSync } from "node:child_process";
import { createHash, randomBytes, X509Certificate } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { get as httpGet } from "node:http";
import { get as httpsGet } from "node:https";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
/** Where the CA and the server certificate live (absolute: processes that read it run in other directories). */
export const TLS_DIR = join(ROOT, "test/.generated/tls");
const DAY_MS = 86_400_000;

/** The files of a usable set in `dir`, or undefined when one is missing, expired within a day, or not for loopback. */
function usable(dir) {
  const files = { dir, caFile: join(dir, "ca.pem"), certFile: join(dir, "server.pem"), keyFile: join(dir, "server-key.pem") };
  if (![files.caFile, files.certFile, files.keyFile].every((f) => existsSync(f))) return undefined;
  try {
    const ca = new X509Certificate(readFileSync(files.caFile));
    const cert = new X509Certificate(readFileSync(files.certFile));
    const fresh = (c) => Date.parse(c.validTo) > Date.now() + DAY_MS;
    const forLoopback = cert.checkIP("127.0.0.1") && cert.checkIP("::1") && cert.checkHost("localhost");
    return fresh(ca) && fresh(cert) && cert.checkIssued(ca) && cert.verify(ca.publicKey) && forLoopback ? files : undefined;
  } catch {
    return undefined; // damaged: made again
  }
}

function openssl(args, cwd) {
  const r = spawnSync("openssl", args, { cwd, encoding: "utf8" });
  if (r.error) throw new Error(`the tests' TLS certificates are made with the openssl CLI, which could not run: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`openssl ${args[0]} failed (exit ${r.status}): ${r.stderr.trim()}`);
}

/**
 * Makes a CA and a server certificate in `dir`: ECDSA P-256 keys (what Google's own front ends present to clients
 * that offer it), the server's with subjectAltName 127.0.0.1, ::1 and localhost, for serverAuth only.
 */
function make(dir) {
  mkdirSync(dir, { recursive: true });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  openssl(
    [
      "req",
      "-x509",
      ...ec,
      "-keyout",
      "ca-key.pem",
      "-out",
      "ca.pem",
      "-days",
      "3650",
      "-subj",
      "/CN=orbax2reg test CA",
      "-addext",
      "basicConstraints=critical,CA:TRUE",
      "-addext",
      "keyUsage=critical,keyCertSign,cRLSign",
    ],
    dir,
  );
  openssl(["req", ...ec, "-keyout", "server-key.pem", "-out", "server.csr", "-subj", "/CN=localhost"], dir);
  writeFileSync(
    join(dir, "server.ext"),
    "subjectAltName = IP:127.0.0.1, IP:::1, DNS:localhost\nbasicConstraints = CA:FALSE\nkeyUsage = critical, digitalSignature\nextendedKeyUsage = serverAuth\n",
  );
  const serial = `0x${randomBytes(8).toString("hex")}`;
  openssl(
    [
      "x509",
      "-req",
      "-in",
      "server.csr",
      "-CA",
      "ca.pem",
      "-CAkey",
      "ca-key.pem",
      "-set_serial",
      serial,
      "-days",
      "825",
      "-extfile",
      "server.ext",
      "-out",
      "server.pem",
    ],
    dir,
  );
}

let made;

/**
 * The test CA and the loopback server certificate: their files (absolute paths) and contents. Made on first use and
 * kept; made again only when missing, damaged or about to expire. Made in a scratch directory and renamed into place,
 * so that two processes making it at once each end with a whole set (the second one's rename loses, and it takes the
 * first one's).
 */
export function testTls() {
  if (made !== undefined) return made;
  let files = usable(TLS_DIR);
  if (files === undefined) {
    const scratch = `${TLS_DIR}.${process.pid}-${randomBytes(4).toString("hex")}`;
    try {
      make(scratch);
      if (existsSync(TLS_DIR) && usable(TLS_DIR) === undefined) rmSync(TLS_DIR, { recursive: true, force: true });
      try {
        renameSync(scratch, TLS_DIR);
      } catch (e) {
        if (usable(TLS_DIR) === undefined) throw e; // not another process's set: a real failure
      }
    } finally {
      rmSync(scratch, { recursive: true, force: true });
    }
    files = usable(TLS_DIR);
    if (files === undefined) throw new Error(`the test certificates in ${TLS_DIR} are not usable after making them`);
  }
  made = { ...files, ca: readFileSync(files.caFile), cert: readFileSync(files.certFile), key: readFileSync(files.keyFile) };
  return made;
}

/** Options for a node `https`/`tls` server that serves the loopback certificate. */
export const serverTls = () => ({ key: testTls().key, cert: testTls().cert });

/** Options for a node `https`/`tls` client that trusts the test CA, in a process started without it (see trustTestCa). */
export const clientTls = () => ({ ca: testTls().ca });

/** Bundles of the test CA and a machine's own NODE_EXTRA_CA_CERTS are named so in TLS_DIR. */
const BUNDLE = /^trust-[0-9a-f]{16}\.pem$/;
const ours = (file) => file === testTls().caFile || (dirname(file) === TLS_DIR && BUNDLE.test(file.slice(TLS_DIR.length + 1)));

/**
 * Sets NODE_EXTRA_CA_CERTS in `env` (process.env by default) to the test CA, so that every node process started
 * with it afterwards (vitest's forked workers, the CLI, the jobs, the function, the hooks' processes) trusts the
 * emulators. The current process does not: node read its own at its start. A machine that already sets it (a
 * corporate CA, a system bundle) keeps it: the variable names one file, so it then names a bundle of both.
 */
export function trustTestCa(env = process.env) {
  const { caFile, ca } = testTls();
  const before = env.NODE_EXTRA_CA_CERTS;
  if (!before || ours(before)) {
    env.NODE_EXTRA_CA_CERTS = before || caFile;
    return env;
  }
  let theirs = "";
  try {
    theirs = readFileSync(before, "utf8");
  } catch {
    // unreadable: node would only warn about it; the test CA alone, then
  }
  const content = `${theirs.trimEnd()}\n${ca.toString()}`;
  const bundle = join(TLS_DIR, `trust-${createHash("sha256").update(content).digest("hex").slice(0, 16)}.pem`);
  if (!existsSync(bundle)) {
    const scratch = `${bundle}.${process.pid}`;
    writeFileSync(scratch, content);
    renameSync(scratch, bundle);
  }
  env.NODE_EXTRA_CA_CERTS = bundle;
  return env;
}

/** Whether this process was started trusting the test CA. */
export const trusted = () => process.env.NODE_EXTRA_CA_CERTS !== undefined && ours(process.env.NODE_EXTRA_CA_CERTS);

/**
 * For a benchmark's entry point: returns at once when this process trusts the test CA; otherwise runs the same
 * script again in a child that does (same arguments and node flags, output inherited, signals passed on) and exits
 * with its status, never returning. A benchmark uses the emulator itself (buckets, uploads, an in-process GcsStore),
 * and node takes the CA only at its start.
 */
export async function runTrustingTestCa() {
  if (trusted()) return;
  const child = spawn(process.execPath, [...process.execArgv, ...process.argv.slice(1)], {
    stdio: "inherit",
    env: trustTestCa({ ...process.env }),
  });
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(signal, () => child.kill(signal));
  const [code, signal] = await new Promise((done) => child.once("exit", (c, s) => done([c, s])));
  process.exit(code ?? 128 + (signal === "SIGINT" ? 2 : signal === "SIGHUP" ? 1 : 15));
}

/**
 * Whether a GET of `url` answers 2xx: a server's readiness probe. Over https it trusts the test CA explicitly, so it
 * works in a process started without it (vitest's main process, where the global setup runs).
 */
export function answersOk(url, timeoutMs = 5_000) {
  return new Promise((done) => {
    const get = url.startsWith("https:") ? httpsGet : httpGet;
    const req = get(url, { ...(url.startsWith("https:") ? clientTls() : {}), timeout: timeoutMs, agent: false }, (res) => {
      res.resume();
      res.on("end", () => done((res.statusCode ?? 0) >= 200 && (res.statusCode ?? 0) < 300));
      res.on("error", () => done(false));
    });
    req.on("timeout", () => req.destroy());
    req.on("error", () => done(false)); // not listening yet, or not speaking TLS yet
  });
}
