"""Writes a large merged OCDBT root the way Orbax does, for listing tests and the OCDBT benchmark.

OUT_DIR/bigtree/state/ gets two per-process databases (ocdbt.process_0/, ocdbt.process_1/) written with
Orbax's own OCDBT options, merged into the root manifest with Orbax's own merge function. With Orbax's
100 MB node limit the merged root is one leaf, so OUT_DIR/bigtree/state-deep/ repeats the merge (same
per-process databases, copied) with max_decoded_node_bytes = 64 KiB: a multi-level B+tree whose nodes
mix the two processes' base paths. Keys look like
zarr chunk keys of many parameters; every 10th value is larger than max_inline_value_bytes, so it is
stored out of line. OUT_DIR/bigtree/expected.json records the key count and a hash of the sorted keys.

Usage: python bigtree.py OUT_DIR [--keys N]
"""

import argparse
import asyncio
import hashlib
import json
import os
import shutil

import tensorstore as ts
from etils import epath
from orbax.checkpoint._src.serialization import ocdbt_utils
from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils


def key_of(i: int, process: int) -> str:
    # Interleave the two processes' keys so the merged tree mixes base paths within nodes.
    return f"params.block_{i // 4:06d}.w/{i % 4}.{process}"


def value_of(i: int, process: int) -> bytes:
    size = 1500 if i % 10 == 0 else 24
    seed = hashlib.sha256(f"{i}:{process}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


async def write_process(directory: str, process: int, n: int, context: ts.Context) -> None:
    spec = ts_utils.build_kvstore_tspec(directory, use_ocdbt=True, process_id=process)
    ts_utils.add_ocdbt_write_options(spec)
    kv = await ts.KvStore.open(spec, context=context)
    txn = ts.Transaction(atomic=True)
    for i in range(n):
        await kv.with_transaction(txn).write(key_of(i, process), value_of(i, process))
    await txn.commit_async()


async def merge_small_nodes(directory: str, context: ts.Context) -> None:
    """Orbax's merge (copy_range_to of every per-process DB in one atomic transaction), small nodes."""
    children = [
        await ts.KvStore.open(ts_utils.build_kvstore_tspec_for_merge(directory, f"{ts_utils.PROCESS_SUBDIR_PREFIX}{p}"), context=context)
        for p in (0, 1)
    ]
    spec = ts_utils.build_kvstore_tspec(directory, use_ocdbt=True)
    ts_utils.add_ocdbt_write_options(spec)
    spec["config"]["max_decoded_node_bytes"] = 65536
    parent = await ts.KvStore.open(spec, context=context)
    txn = ts.Transaction(atomic=True)
    for child in children:
        await child.experimental_copy_range_to(parent.with_transaction(txn))
    await txn.commit_async()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--keys", type=int, default=100_000, help="total keys (split over two processes)")
    args = parser.parse_args()
    root = os.path.abspath(os.path.join(args.out_dir, "bigtree"))
    shutil.rmtree(root, ignore_errors=True)
    state = os.path.join(root, "state")
    os.makedirs(state)
    context = ts_utils.get_ts_context(use_ocdbt=True)
    per_process = args.keys // 2
    for process in (0, 1):
        await write_process(state, process, per_process, context)
    await ocdbt_utils.merge_ocdbt_per_process_files(epath.Path(state), context, use_zarr3=False, enable_validation=False)

    deep = os.path.join(root, "state-deep")
    os.makedirs(deep)
    for process in (0, 1):
        name = f"{ts_utils.PROCESS_SUBDIR_PREFIX}{process}"
        shutil.copytree(os.path.join(state, name), os.path.join(deep, name))
    await merge_small_nodes(deep, context)

    keys = sorted(key_of(i, p) for p in (0, 1) for i in range(per_process))
    for db in (state, deep):
        merged = await ts.KvStore.open({"driver": "ocdbt", "base": f"file://{db}"})
        listed = [k.decode() for k in await merged.list()]
        assert sorted(listed) == keys, f"{db} does not list every key"
    with open(os.path.join(root, "expected.json"), "w") as f:
        json.dump({"keys": len(keys), "sorted_keys_sha256": hashlib.sha256("\n".join(keys).encode()).hexdigest()}, f, indent=1)
    print(f"bigtree: {len(keys)} keys in {state}")


if __name__ == "__main__":
    asyncio.run(main())
