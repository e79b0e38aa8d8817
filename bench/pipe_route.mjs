#!/usr/bin/env node
// What Node's own transport costs to move a conversion's bytes: the objects a conversion wrote (their sizes),
// each filled by a ranged download from the source step and uploaded as that download streams in, through
// undici's request() with Node's sockets and TLS, as plainly as they allow: no conversion, no checksum, no retry,
// no stall clock, no plan. bench/gcs.mjs runs it beside orbax2reg: its CPU is the least a client on undici and
// Node's TLS spends moving those bytes here, so orbax2reg's CPU over it is what the converter adds (issue 36's
// targets were moved against it: a client cannot spend less than its transport does).
//
//   node bench/pipe_route.mjs ENDPOINT SRC_BUCKET SRC_PREFIX DST_BUCKET DST_PREFIX SIZES_JSON [--parallel 16]
//
// SIZES_JSON: a file holding the sizes of the objects to write (bytes). The source's objects are laid end to end
// and each output object takes the next range of its size that fits inside one of them (from the start again
// when they run out). Prints {"objects": N, "bytes": B}.
import { readFileSync } from "node:fs";
import { request } from "undici";
import { flag, flags } from "./lib.mjs";

const opts = flags(
  process.argv.slice(2),
  { "--parallel": flag.count(16) },
  { positionals: { names: "ENDPOINT SRC_BUCKET SRC_PREFIX DST_BUCKET DST_PREFIX SIZES_JSON", min: 6, max: 6 } },
);
const [endpoint, srcBucket, srcPrefix, dstBucket, dstPrefix, sizesFile] = opts._;
const { parallel } = opts;
const sizes = JSON.parse(readFileSync(sizesFile, "utf8"));
const auth = { authorization: "Bearer bench" };

const sources = [];
for (let pageToken; ; ) {
  const q = new URLSearchParams({ prefix: `${srcPrefix}/`, fields: "items(name,size),nextPageToken" });
  if (pageToken) q.set("pageToken", pageToken);
  const r = await request(`${endpoint}/storage/v1/b/${srcBucket}/o?${q}`, { headers: auth });
  const page = await r.body.json();
  for (const o of page.items ?? []) sources.push({ name: o.name, size: Number(o.size) });
  pageToken = page.nextPageToken;
  if (!pageToken) break;
}

// Each output object's range: the next one of its size that fits in a source object.
const ranges = [];
{
  let s = 0;
  let at = 0;
  for (const size of sizes) {
    for (let tries = 0; sources[s].size - at < size; tries++) {
      if (tries > sources.length) throw new Error(`no source object holds ${size} bytes`);
      s = (s + 1) % sources.length;
      at = 0;
    }
    ranges.push({ name: sources[s].name, at, size });
    at += size;
  }
}

let next = 0;
let bytes = 0;
async function worker() {
  while (next < ranges.length) {
    const i = next++;
    const { name, at, size } = ranges[i];
    const dst = `${dstPrefix}/${String(i).padStart(6, "0")}`;
    if (size === 0) {
      await upload(dst, Buffer.alloc(0), 0);
      continue;
    }
    const down = await request(`${endpoint}/storage/v1/b/${srcBucket}/o/${encodeURIComponent(name)}?alt=media`, {
      headers: { ...auth, range: `bytes=${at}-${at + size - 1}` },
    });
    if (down.statusCode !== 206) throw new Error(`download ${name}: HTTP ${down.statusCode} ${(await down.body.text()).slice(0, 200)}`);
    await upload(dst, down.body, size);
    bytes += size;
  }
}
async function upload(name, body, size) {
  const q = new URLSearchParams({ uploadType: "media", name });
  const r = await request(`${endpoint}/upload/storage/v1/b/${dstBucket}/o?${q}`, {
    method: "POST",
    headers: { ...auth, "content-type": "application/octet-stream", "content-length": String(size) },
    body,
  });
  const text = await r.body.text();
  if (r.statusCode !== 200) throw new Error(`upload ${name}: HTTP ${r.statusCode} ${text.slice(0, 200)}`);
}
await Promise.all(Array.from({ length: parallel }, worker));
console.log(JSON.stringify({ objects: ranges.length, bytes }));
