// What the benchmarks share: their command line (flags parsed and checked, the build and the tools they need
// checked before any work), timing a child (wall, CPU, peak RSS of its process tree), sampling how busy
// the machine is, files and bytes under a directory, failing loudly, fresh destinations, and a summary
// of a node --cpu-prof profile. See bench/README.md ("bench/lib.mjs").
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { SourceMap } from "node:module";
import os from "node:os";
import { basename, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository's root: every benchmark chdirs there, so its relative paths hold from any cwd. */
export const ROOT = resolve(fileURLToPath(import.meta.url), "../..");

export const say = (line = "") => console.log(line);
export const sh = (cmd, argv, opts = {}) => spawnSync(cmd, argv, { encoding: "utf8", maxBuffer: 64 << 20, ...opts });
export const fmt = (x, digits = 2) => x.toFixed(digits);
export const mb = (bytes) => bytes / 1e6;
export const mib = (bytes) => bytes / 2 ** 20;
export const sum = (xs) => xs.reduce((a, b) => a + b, 0);

/** Files under `dir`, recursively, sorted (so uploads and warm-ups go in the same order every run). */
export function filesUnder(dir) {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => join(e.parentPath, e.name))
    .sort();
}

export const bytesUnder = (dir) => sum(filesUnder(dir).map((f) => statSync(f).size));

/** Exits with the command's stderr tail when it failed; otherwise returns it. */
export function must(r, what) {
  if (r.status !== 0) {
    console.error(`${what} failed (exit ${r.status}):\n${(r.stderr ?? "").slice(-4000)}`);
    process.exit(1);
  }
  return r;
}

/**
 * An empty `dir`; with `sync` (the default) the previous run's dirty pages are flushed too, so that its
 * writeback is not timed in the next run.
 */
export function freshDir(dir, { sync = true } = {}) {
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  if (sync) sh("sync", []);
}

/** Seconds a `sync` takes: what the previous run left in the page cache. */
export function syncSeconds() {
  const t0 = performance.now();
  sh("sync", []);
  return (performance.now() - t0) / 1000;
}

// ---------------------------------------------------------------------------------------------------
// Command lines: each benchmark declares its flags once; a bad value, an unknown flag or a missing argument is
// one line on stderr and exit 2, before any work (and before runTrustingTestCa() re-runs the script).

/** The running script, as its usage line names it. */
const SCRIPT = `bench/${basename(process.argv[1] ?? "?")}`;

/** Exits 2 with one line saying what is wrong with the command line. */
export function usageError(message) {
  console.error(`${SCRIPT}: ${message} (--help lists the flags)`);
  process.exit(2);
}

/** A flag that takes a value: `parse` returns it typed or throws what the flag takes. */
const valued = (metavar, dflt, parse) => ({ metavar, dflt: dflt === undefined ? undefined : String(dflt), parse });
const number = (s) => (s.trim() === "" ? Number.NaN : Number(s));
const items = (s) => s.split(",");

/** The kinds of flag flags() knows. A default is written as on the command line (or undefined: no default). */
export const flag = {
  /** Present or not: `--profile`. */
  on: () => ({ metavar: undefined }),
  /** A positive integer: `--runs 3`. */
  count: (dflt, metavar = "N") =>
    valued(metavar, dflt, (s) => {
      const n = number(s);
      if (!Number.isInteger(n) || n < 1) throw "a positive integer";
      return n;
    }),
  /** A number at least `min` (Infinity included): `--delay 30`. */
  number: (dflt, { min = 0, metavar = "N" } = {}) =>
    valued(metavar, dflt, (s) => {
      const n = number(s);
      if (Number.isNaN(n) || n < min) throw `a number${min === Number.NEGATIVE_INFINITY ? "" : ` >= ${min}`}`;
      return n;
    }),
  /** Any text but an empty one: `--step DIR`. */
  text: (dflt, metavar = "VALUE") =>
    valued(metavar, dflt, (s) => {
      if (s === "") throw "a value";
      return s;
    }),
  /** One of `choices`: `--only big`. */
  choice: (dflt, choices) =>
    valued(choices.join("|"), dflt, (s) => {
      if (!choices.includes(s)) throw `one of ${choices.join(", ")}`;
      return s;
    }),
  /** Positive integers separated by commas: `--tasks 1,2,4`. */
  counts: (dflt, metavar = "N,...") =>
    valued(metavar, dflt, (s) => {
      const ns = items(s).map(number);
      if (!ns.every((n) => Number.isInteger(n) && n >= 1)) throw "positive integers separated by commas, such as 1,2,4";
      return ns;
    }),
  /** A benchmark's own format: `parse(text)` returns the value or throws what the flag takes, in words. */
  parsed: (dflt, metavar, parse) => valued(metavar, dflt, parse),
  /** Some of `choices`, separated by commas: `--rows tls,plain`. */
  some: (dflt, choices) =>
    valued(`${choices.join("|")},...`, dflt, (s) => {
      const xs = items(s);
      if (!xs.every((x) => choices.includes(x))) throw `some of ${choices.join(",")} (separated by commas)`;
      return xs;
    }),
};

const camel = (name) => name.replace(/^--/, "").replace(/-(.)/g, (_, c) => c.toUpperCase());

/** The script's header comment (its description and usage lines), for --help. */
function header() {
  const lines = readFileSync(process.argv[1], "utf8").split("\n");
  const out = [];
  for (const line of lines.slice(lines[0].startsWith("#!") ? 1 : 0)) {
    if (!line.startsWith("//")) break;
    out.push(line.replace(/^\/\/ ?/, ""));
  }
  return out;
}

/**
 * The command line `argv` (process.argv.slice(2)) parsed by `spec` (flag name -> a kind of `flag`): the values by
 * camelCased name (`--max-shard-size` -> maxShardSize; a flag.on() is true or false, an absent flag its default),
 * and with `positionals` ({ names, min, max }) the other arguments as `_`. Exits 2 with one line for an unknown
 * flag, a flag given twice, a bad or missing value, or too few or too many other arguments; --help prints the
 * script's header comment and its flags, and exits 0.
 */
export function flags(argv, spec, { positionals } = {}) {
  if (argv.includes("--help")) {
    for (const line of header()) say(line);
    const list = Object.entries(spec).map(([name, k]) =>
      k.metavar === undefined ? name : `${name} ${k.metavar}${k.dflt === undefined ? "" : ` (${k.dflt})`}`,
    );
    say(`flags: ${list.length ? list.join(", ") : "none"}; --help`);
    process.exit(0);
  }
  const given = new Map();
  const rest = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--") {
      rest.push(...argv.slice(i + 1));
      break;
    }
    if (!a.startsWith("--")) {
      rest.push(a);
      continue;
    }
    const kind = spec[a];
    if (kind === undefined) usageError(`unknown flag ${a}`);
    if (given.has(a)) usageError(`${a} is given twice`);
    if (kind.metavar === undefined) {
      given.set(a, true);
      continue;
    }
    const v = argv[i + 1];
    if (v === undefined || v.startsWith("--")) usageError(`${a} takes ${describe(kind)}, and none was given`);
    given.set(a, parsed(a, kind, v));
    i++;
  }
  const out = {};
  for (const [name, kind] of Object.entries(spec)) {
    out[camel(name)] = given.has(name)
      ? given.get(name)
      : kind.metavar === undefined
        ? false
        : kind.dflt === undefined
          ? undefined
          : parsed(name, kind, kind.dflt);
  }
  const { names = "", min = 0, max = 0 } = positionals ?? {};
  if (rest.length > max) usageError(`unexpected argument${rest.length - max > 1 ? "s" : ""} ${rest.slice(max).join(" ")}`);
  if (rest.length < min) usageError(`missing argument: ${names} expected`);
  if (positionals) out._ = rest;
  return out;
}

/** What a flag takes, in words (its parse's complaint about an empty value). */
function describe(kind) {
  try {
    kind.parse("");
    return "a value";
  } catch (what) {
    return what;
  }
}

function parsed(name, kind, text) {
  try {
    return kind.parse(text);
  } catch (what) {
    return usageError(`${name} takes ${what}, not "${text}"`);
  }
}

/** The npm script that runs this benchmark, if package.json has one: `bench:gcs` for bench/gcs.mjs. */
function npmScript() {
  const scripts = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")).scripts ?? {};
  return Object.keys(scripts).find((k) => scripts[k].endsWith(`node ${SCRIPT}`));
}

/**
 * Exits 1 unless the build is there: `file` under the repository (dist/'s CLI by default) and, given `command`,
 * the built CLI answering `<command> --help` (a build from before that command has none).
 */
export function requireBuilt({ file = "dist/src/cli/main.js", command } = {}) {
  if (!existsSync(join(ROOT, file))) {
    const npm = npmScript();
    console.error(`${file} is missing: build first with \`npm run build\`${npm ? ` (or use \`npm run ${npm}\`)` : ""}`);
    process.exit(1);
  }
  // An unknown command's --help prints the program's help and exits 0 too: the usage line tells them apart.
  const help = command === undefined ? undefined : sh(process.execPath, [join(ROOT, "bin/orbax2reg.js"), command, "--help"]);
  if (help !== undefined && (help.status !== 0 || !help.stdout.startsWith(`Usage: orbax2reg ${command} `))) {
    console.error(`this build of orbax2reg has no \`${command}\` command`);
    process.exit(1);
  }
}

/** Exits 1 at the first of `needs` ([path, what to do about it]) missing (relative paths: from the current directory). */
export function requireFiles(needs) {
  for (const [path, fix] of needs) {
    if (!existsSync(path)) {
      console.error(`${path} is missing: ${fix}`);
      process.exit(1);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Timed runs: wall time measured here, CPU and peak RSS by GNU time (ru_maxrss of the child, which includes
// the descendants it waited for) or, without /usr/bin/time, peak RSS by polling VmHWM of the process tree.

/**
 * The 2 GB fuji-shaped step (bench/gen_fuji.py: generated once, cached under bench/.generated/fuji-mini): the
 * generator's record, the step's directory and name, its files and their bytes.
 */
export function fujiStep(python = ".venv/bin/python") {
  say("Source: generating or reusing bench/.generated/fuji-mini (bench/gen_fuji.py) ...");
  const gen = must(sh(python, ["bench/gen_fuji.py"], { stdio: ["ignore", "pipe", "inherit"] }), "bench/gen_fuji.py");
  const info = JSON.parse(gen.stdout.trim().split("\n").pop());
  const dir = resolve(info.step_dir);
  const files = filesUnder(dir);
  return { info, dir, name: dir.split("/").pop(), files, bytes: sum(files.map((f) => statSync(f).size)) };
}

// Asked on first use, not on import: the helper processes that import this module only for flags() (the
// delay proxy, the ingest and pipe routes, timed as a whole by bench/gcs.mjs) spawn nothing for it.
let hasGnuTime;
/** Whether GNU time (`/usr/bin/time -v`) is there to measure a child's CPU and peak RSS. */
export const gnuTime = () => (hasGnuTime ??= existsSync("/usr/bin/time") && sh("/usr/bin/time", ["-v", "true"]).status === 0);

/** `pid` and every process below it (from /proc/<pid>/task/<tid>/children). */
export function descendants(pid) {
  const out = [pid];
  for (let i = 0; i < out.length; i++) {
    try {
      for (const tid of readdirSync(`/proc/${out[i]}/task`)) {
        const kids = readFileSync(`/proc/${out[i]}/task/${tid}/children`, "utf8").trim();
        if (kids) out.push(...kids.split(" ").map(Number));
      }
    } catch {}
  }
  return out;
}

let clkTck;
const CLK_TCK = () => (clkTck ??= Number(sh("getconf", ["CLK_TCK"]).stdout.trim()) || 100);

/**
 * User + system CPU seconds spent so far by the processes under each of `pids` (themselves and descendants,
 * e.g. nginx's workers): a server's share of a run is the difference of two readings around it.
 */
export function cpuSecondsOf(pids) {
  let ticks = 0;
  for (const pid of pids.flatMap(descendants)) {
    try {
      // Fields after the command's closing parenthesis: state is the first, utime the 12th, stime the 13th.
      const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ").pop().split(" ");
      ticks += Number(f[11]) + Number(f[12]);
    } catch {}
  }
  return ticks / CLK_TCK();
}

export function vmHwmKiB(pid) {
  try {
    return Number((readFileSync(`/proc/${pid}/status`, "utf8").match(/^VmHWM:\s*(\d+)/m) ?? [])[1] ?? 0);
  } catch {
    return 0;
  }
}

let timeFiles = 0;

/**
 * Runs cmd (environment: process.env plus `env`) and resolves to { seconds, rssKiB, cpu (user + system
 * seconds; NaN without GNU time), stdout, stderr, status }; a failure is a status, not a rejection.
 */
export function timed(cmd, argv, env = {}) {
  // Per process and run: two benchmarks at once must not read each other's figures.
  const timeFile = join(os.tmpdir(), `orbax2reg-bench-${process.pid}-${timeFiles++}.time`);
  const GNU_TIME = gnuTime();
  const [c, a] = GNU_TIME ? ["/usr/bin/time", ["-v", "-o", timeFile, cmd, ...argv]] : [cmd, argv];
  return new Promise((done, fail) => {
    const t0 = performance.now();
    const child = spawn(c, a, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => {
      stdout += d;
    });
    child.stderr.on("data", (d) => {
      stderr += d;
    });
    let polled = 0;
    const poll = GNU_TIME
      ? undefined
      : setInterval(() => {
          for (const pid of descendants(child.pid)) polled = Math.max(polled, vmHwmKiB(pid));
        }, 20);
    child.on("error", fail);
    child.on("close", (status) => {
      const seconds = (performance.now() - t0) / 1000;
      if (poll) clearInterval(poll);
      let rssKiB = polled;
      let cpu = Number.NaN;
      if (GNU_TIME && existsSync(timeFile)) {
        const t = readFileSync(timeFile, "utf8");
        rssKiB = Number((t.match(/Maximum resident set size \(kbytes\): (\d+)/) ?? [])[1] ?? Number.NaN);
        cpu = ["User", "System"].reduce(
          (acc, k) => acc + Number((t.match(new RegExp(`${k} time \\(seconds\\): ([\\d.]+)`)) ?? [])[1] ?? Number.NaN),
          0,
        );
        rmSync(timeFile, { force: true });
      }
      done({ seconds, rssKiB, cpu, stdout, stderr, status });
    });
  });
}

/** Above this fraction of the CPUs busy with other work, a run is flagged as disturbed. */
export const BUSY_WARN = 0.2;

/** Fraction of all CPUs busy over `ms` (from /proc/stat); sampled while the benchmark itself is idle. */
export function cpuBusy(ms = 500) {
  const read = () => {
    const f = readFileSync("/proc/stat", "utf8").split("\n")[0].trim().split(/\s+/).slice(1).map(Number);
    return { idle: (f[3] ?? 0) + (f[4] ?? 0), total: sum(f.slice(0, 8)) };
  };
  const a = read();
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
  const b = read();
  return b.total === a.total ? 0 : 1 - (b.idle - a.idle) / (b.total - a.total);
}

// ---------------------------------------------------------------------------------------------------
// CPU profiles (node --cpu-prof).

/** What a profiled frame spends its time on. */
function category(cf) {
  const fn = cf.functionName;
  if (fn === "(idle)") return "idle (waiting for I/O: the disk, the network or the emulator)";
  if (fn === "(garbage collector)") return "garbage collection";
  if (fn === "crc32c") return "CRC-32C";
  if (/^(FastBuffer|cloneAsUint8Array|transferArrayBuffer|concat|copy|from|fromArrayLike|allocate)$/.test(fn))
    return "buffer copies and allocations";
  if (/^(writev|writeBuffer|writeGeneric|onStreamRead|readStop|readStart)$/.test(fn)) return "socket reads and writes (syscalls)";
  // Native fs bindings (no script URL); writeBuffer is counted as a socket write above, whichever it was.
  if (
    cf.url === "" &&
    /^(open|openFileHandle|close|read|readdir|readFileUtf8|stat|lstat|fstat|mkdir|rename|unlink|rmdir|fsync|fdatasync|writeString|writeBuffers|ftruncate|realpath|access|copyFile)$/.test(
      fn,
    )
  )
    return "file system calls (their main-thread part)";
  if (/undici|webstreams/.test(`${fn} ${cf.url}`)) return "fetch and web streams (undici): HTTP framing, stream plumbing";
  if (cf.url.includes("/dist/src/")) return "orbax2reg's own code";
  return "other (microtasks, timers, events, the runtime)";
}

/**
 * Main-thread time of a profile: self time by category, top self time by function, and inclusive time of
 * src/ frames; frames of dist/src/ are named by their src/ line through dist's source maps.
 */
export function profileSummary(p, { top = 12 } = {}) {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const parent = new Map();
  for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const maps = new Map();
  const srcLine = (cf) => {
    if (!cf.url.includes("/dist/src/")) return undefined;
    const file = cf.url.startsWith("file:") ? fileURLToPath(cf.url) : cf.url;
    if (!maps.has(file)) maps.set(file, existsSync(`${file}.map`) ? new SourceMap(JSON.parse(readFileSync(`${file}.map`, "utf8"))) : null);
    const e = maps.get(file)?.findEntry(cf.lineNumber, cf.columnNumber);
    const src = e?.originalSource ? e.originalSource.replace(/^.*?(src\/)/, "$1") : file;
    return `${src}:${(e?.originalLine ?? cf.lineNumber) + 1} ${cf.functionName || "(anonymous)"}`;
  };
  const plain = (cf) =>
    `${cf.functionName || "(anonymous)"} ${cf.url ? `${cf.url.replace(/^.*\/(dist\/src\/|node_modules\/|node:)/, "$1")}:${cf.lineNumber + 1}` : ""}`.trim();
  const self = new Map();
  const byCategory = new Map();
  const incl = new Map();
  let total = 0;
  for (let i = 0; i < p.samples.length; i++) {
    const us = p.timeDeltas[i] ?? 0;
    total += us;
    const leaf = byId.get(p.samples[i]);
    const key = srcLine(leaf.callFrame) ?? plain(leaf.callFrame);
    self.set(key, (self.get(key) ?? 0) + us);
    const c = category(leaf.callFrame);
    byCategory.set(c, (byCategory.get(c) ?? 0) + us);
    const seen = new Set();
    for (let id = leaf.id; id !== undefined; id = parent.get(id)) {
      const l = srcLine(byId.get(id).callFrame);
      if (l && !seen.has(l)) {
        seen.add(l);
        incl.set(l, (incl.get(l) ?? 0) + us);
      }
    }
  }
  const ms = (us) => `${fmt(us / 1000, 0).padStart(6)} ms ${fmt((100 * us) / total, 1).padStart(5)} %`;
  const out = [
    `main thread sampled ${fmt(total / 1e6)} s (node's thread pool, where file I/O runs, is not sampled)`,
    "",
    "self time by category:",
  ];
  for (const [k, us] of [...byCategory].sort((a, b) => b[1] - a[1])) out.push(`  ${ms(us)}  ${k}`);
  out.push("", "top self time:");
  for (const [k, us] of [...self].sort((a, b) => b[1] - a[1]).slice(0, top)) out.push(`  ${ms(us)}  ${k}`);
  out.push("", "top src/ frames, inclusive (synchronous stacks only: stream callbacks run outside them):");
  for (const [k, us] of [...incl].sort((a, b) => b[1] - a[1]).slice(0, 10)) out.push(`  ${ms(us)}  ${k}`);
  return out;
}

/** Runs `argv` (node's arguments after the flags) under node --cpu-prof; returns the profile and its wall time, keeping a copy at `keep`. */
export function cpuProfile(argv, keep, env = {}) {
  const dir = `${keep}.d`;
  rmSync(dir, { recursive: true, force: true });
  const t0 = performance.now();
  must(sh(process.execPath, ["--cpu-prof", `--cpu-prof-dir=${dir}`, ...argv], { env: { ...process.env, ...env } }), "profiled run");
  const wall = (performance.now() - t0) / 1000;
  const file = readdirSync(dir).find((n) => n.endsWith(".cpuprofile"));
  rmSync(keep, { force: true });
  sh("cp", [join(dir, file), keep]);
  rmSync(dir, { recursive: true, force: true });
  return { profile: JSON.parse(readFileSync(keep, "utf8")), wall };
}
