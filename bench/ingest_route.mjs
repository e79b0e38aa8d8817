#!/usr/bin/env node
// The emulator's ceiling for a gs:// -> gs:// conversion: the bytes of a conversion's output uploaded from memory
// (no download, no conversion), each object one simple upload (`uploadType=media`) as both clients send them,
// `--parallel` at once. fake-gcs-server takes every upload's body under one lock of its storage backend (it reads
// the body and writes the file while holding it: internal/backend/fs.go, CreateObject), so the emulator ingests
// one object at a time and no client can write its output in less than this. bench/gcs.mjs runs it beside the
// two clients; its wall time is the floor their wall times are compared with.
//
//   node bench/ingest_route.mjs ENDPOINT BUCKET PREFIX SIZES_JSON [--parallel 16]
//
// SIZES_JSON: a file holding the sizes of the objects to write (bytes). The bytes are one buffer's views (the
// emulator hashes what it gets; their values do not matter to it). Prints {"objects": N, "bytes": B}.
import { readFileSync } from "node:fs";
import { request } from "undici";
import { flag, flags } from "./lib.mjs";

const opts = flags(
  process.argv.slice(2),
  { "--parallel": flag.count(16) },
  { positionals: { names: "ENDPOINT BUCKET PREFIX SIZES_JSON", min: 4, max: 4 } },
);
const [endpoint, bucket, prefix, sizesFile] = opts._;
const { parallel } = opts;
const sizes = JSON.parse(readFileSync(sizesFile, "utf8"));
const buffer = Buffer.alloc(Math.max(1, ...sizes), 7);

let next = 0;
let bytes = 0;
async function worker() {
  while (next < sizes.length) {
    const i = next++;
    const q = new URLSearchParams({ uploadType: "media", name: `${prefix}/${String(i).padStart(6, "0")}` });
    const r = await request(`${endpoint}/upload/storage/v1/b/${bucket}/o?${q}`, {
      method: "POST",
      headers: { "content-type": "application/octet-stream", authorization: "Bearer bench" },
      body: buffer.subarray(0, sizes[i]),
    });
    const text = await r.body.text();
    if (r.statusCode !== 200) throw new Error(`upload ${i}: HTTP ${r.statusCode} ${text.slice(0, 200)}`);
    bytes += sizes[i];
  }
}
await Promise.all(Array.from({ length: parallel }, worker));
console.log(JSON.stringify({ objects: sizes.length, bytes }));
