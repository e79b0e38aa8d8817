import { spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { expect, test } from "vitest";
import { filesBelow, MANY_CHUNKS_ROOT } from "../helpers/paths.js";
import { tempDir } from "../helpers/tmp.js";

// A process gets as many descriptors as its hard limit allows (Node raises the soft limit to it); 1,024 is a
// common default. Writing, copying and reading thousands of small objects must stay well below that: each
// write's background flush holds a descriptor until the disk has its bytes.
const LIMIT = 512;
const OBJECTS = 2000;

/** Runs `script` (an ES module using the compiled dist/) under a hard and soft limit of `limit` open files. */
function underFileLimit(limit: number, script: string, args: string[]): { code: number; stderr: string } {
  const command = `ulimit -Hn ${limit} -Sn ${limit} && exec "$0" --input-type=module -e "$1" -- "$@"`;
  // The thread pool as the CLI sizes it (bin/orbax2reg.js): more threads, more flushes at once.
  const env = { ...process.env, UV_THREADPOOL_SIZE: "16" };
  const r = spawnSync("bash", ["-c", command, process.execPath, script, ...args], { encoding: "utf8", env });
  return { code: r.status ?? -1, stderr: r.stderr };
}

// A slow disk (a network filesystem, a busy one): each flush after a write takes 150 ms, and as many are pending
// as the writer starts.
const WRITE_COPY_READ = `
import { open } from "node:fs/promises";
const probe = await open(process.argv[2], "r");
const FileHandle = Object.getPrototypeOf(probe);
await probe.close();
const datasync = FileHandle.datasync;
FileHandle.datasync = async function () {
  await new Promise((resolve) => setTimeout(resolve, 150));
  return datasync.call(this);
};
import { LocalStore } from "${join(process.cwd(), "dist/src/store/local.js")}";
import { mapLimited } from "${join(process.cwd(), "dist/src/util/budget.js")}";
const [root, n] = [process.argv[2], Number(process.argv[3])];
const store = new LocalStore(root);
const keys = Array.from({ length: n }, (_, i) => \`d\${i % 50}/o\${i}\`);
const bytes = new Uint8Array(2048).fill(7);
await mapLimited(keys, 64, (k) => store.write(k, bytes));
const buffer = new Uint8Array(4096);
await mapLimited(keys, 64, (k) => store.copyRangeTo(k, 0, 1024, store, \`copies/\${k}\`, buffer));
await mapLimited(keys, 64, (k) => store.readRange(k, 10, 100));
FileHandle.datasync = datasync;
await store.makeDurable("");
`;

test(`${OBJECTS} objects are written, copied, read and made durable under a limit of ${LIMIT} open files`, () => {
  const root = tempDir("fds");
  const r = underFileLimit(LIMIT, WRITE_COPY_READ, [root, String(OBJECTS)]);
  expect(r.stderr).toBe("");
  expect(r.code).toBe(0);
  expect(readdirSync(join(root, "d7"))).toHaveLength(OBJECTS / 50);
  expect(readdirSync(join(root, "copies", "d7"))).toHaveLength(OBJECTS / 50);
});

test("a real step of 6,400 small chunks converts through the CLI under a limit of 512 open files", () => {
  // Before the pools, this step failed with EMFILE here: the flushes of thousands of written files piled up.
  const dest = tempDir("fds-step");
  const command = `ulimit -Hn 512 -Sn 512 && exec "$0" bin/orbax2reg.js convert "$1" "$2" --json`;
  const r = spawnSync("bash", ["-c", command, process.execPath, `${MANY_CHUNKS_ROOT}/step_00000100`, dest], { encoding: "utf8" });
  expect(r.stderr).not.toMatch(/EMFILE|orbax2reg:/);
  expect(r.status).toBe(0);
  expect(JSON.parse(r.stdout)).toMatchObject({ objects: 6500, written: 6500, committed: true });
  expect(filesBelow(join(dest, "step_00000100", "gda"))).toHaveLength(6500);
}, 180_000);
