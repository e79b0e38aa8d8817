#!/usr/bin/env python3
"""TensorStore's C++ GCS client doing the conversion's raw chunk passthrough: the baseline of bench/gcs.mjs.

Usage (bench/gcs.mjs runs it):
    TENSORSTORE_GCS_HTTP_URL=http://127.0.0.1:PORT GOOGLE_AUTH_TOKEN_FOR_TESTING=x TENSORSTORE_GCS_HTTP_VERSION=1.1 \\
    .venv/bin/python bench/tensorstore_gcs_route.py SRC_BUCKET SRC_STEP DST_BUCKET DST_STEP [CONCURRENCY]

TENSORSTORE_GCS_HTTP_URL points TensorStore's gcs kvstore driver at an emulator (its documented environment
variable, https://google.github.io/tensorstore/environment.html, and its gcs driver page's "Testing" section);
GOOGLE_AUTH_TOKEN_FOR_TESTING gives it a bearer
token instead of looking for Google credentials. It opens the step's `state` item as an OCDBT kvstore on GCS,
lists every key, reads each value (a zarr chunk or a `.zarray`) and writes it unchanged to
gs://DST_BUCKET/DST_STEP/gda/<slash path>/<chunk key>, at most CONCURRENCY (default 16, orbax2reg's
default) chunks in flight, then copies `index/index` to `index` (written last, as the commit marker).
No decoding, no re-encoding: the same bytes orbax2reg moves for a zstd step. Prints one JSON line.
"""

import asyncio
import json
import sys
import time

import tensorstore as ts


def main(argv) -> int:
    src_bucket, src_step, dst_bucket, dst_step = argv[:4]
    concurrency = int(argv[4]) if len(argv) > 4 else 16
    t0 = time.monotonic()
    context = ts.Context()
    gcs = lambda bucket, path: {"driver": "gcs", "bucket": bucket, "path": path}  # noqa: E731
    src = ts.KvStore.open({"driver": "ocdbt", "base": gcs(src_bucket, f"{src_step}/state/")}, context=context).result()
    src_root = ts.KvStore.open(gcs(src_bucket, f"{src_step}/"), context=context).result()
    dst = ts.KvStore.open(gcs(dst_bucket, f"{dst_step}/"), context=context).result()
    keys = src.list().result()
    t1 = time.monotonic()

    def target(key: bytes) -> str:
        # "<dotted.orbax.name>/<chunk or .zarray>" -> "gda/<dotted/orbax/name>/<chunk or .zarray>"
        name, _, leaf = key.decode().partition("/")
        return f"gda/{name.replace('.', '/')}/{leaf}"

    moved = 0

    async def copy_all():
        nonlocal moved
        gate = asyncio.Semaphore(concurrency)

        async def one(key: bytes):
            nonlocal moved
            async with gate:
                r = await src.read(key)
                await dst.write(target(key), r.value)
                moved += len(r.value)

        await asyncio.gather(*(one(k) for k in keys))

    asyncio.run(copy_all())
    t2 = time.monotonic()
    dst.write("index", src_root.read("index/index").result().value).result()
    t3 = time.monotonic()
    print(json.dumps({"keys": len(keys), "bytes": moved, "list_s": round(t1 - t0, 2), "copy_s": round(t2 - t1, 2), "seconds": round(t3 - t0, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
