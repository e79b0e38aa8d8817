// Preloaded (node --import) by connector-hook.mjs into the one task attempt a {"fault": "kill", "inShard": N} fault
// names: the task dies (SIGKILL, as Cloud Run stops a task whose instance is lost) while it writes its Nth shard, once
// the shard's first bytes are made and taken by the upload, the shards before it written. So the kill lands inside a
// shard every time, however fast or loaded the machine. It patches the GCS store's write for the process's own
// `*.safetensors` objects only; every other write, and every shard before the Nth, goes through unchanged.
import { GcsStore } from "../../dist/src/store/gcs.js";

const nth = Number(process.env.E2E_KILL_IN_SHARD);
let shards = 0;
const write = GcsStore.prototype.write;

GcsStore.prototype.write = function (key, data, options) {
  const streamed = data !== null && typeof data === "object" && Symbol.asyncIterator in data;
  if (!key.endsWith(".safetensors") || !streamed || ++shards < nth) return write.call(this, key, data, options);
  const source = data[Symbol.asyncIterator]();
  async function* cutShort() {
    const first = await source.next();
    if (!first.done) yield first.value;
    // Synchronous on a pipe (Linux), so the line is out before the process dies.
    process.stderr.write(`${JSON.stringify({ message: "killed while writing a shard (injected)", shard: key, nth })}\n`);
    process.kill(process.pid, "SIGKILL");
    await new Promise(() => {});
  }
  return write.call(this, key, cutShort(), options);
};
