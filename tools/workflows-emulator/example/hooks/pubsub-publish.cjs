// googleapis.pubsub.v1.projects.topics.publish stand-in: publishes to the Pub/Sub emulator
// (PUBSUB_EMULATOR_HOST) with @google-cloud/pubsub; resolve it via NODE_PATH or the repo's node_modules.
let input = "";
process.stdin
  .on("data", (d) => (input += d))
  .on("end", async () => {
    const { args } = JSON.parse(input);
    const { PubSub } = require("@google-cloud/pubsub");
    const [, project, , topicId] = args.topic.split("/");
    const ps = new PubSub({ projectId: project });
    const topic = ps.topic(topicId);
    const messageIds = [];
    try {
      for (const m of args.body.messages) {
        messageIds.push(await topic.publishMessage({ data: Buffer.from(m.data ?? "", "base64"), attributes: m.attributes ?? {} }));
      }
    } catch (err) {
      console.log(JSON.stringify({ message: String(err.message ?? err), code: err.code === 5 ? 404 : 500, tags: ["HttpError"] }));
      process.exit(1);
    }
    await ps.close();
    console.log(JSON.stringify({ messageIds }));
  });
