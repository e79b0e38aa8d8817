// `npm run test:faults`: the long fault soak (test/faults/soak.ts), with the suite's global setup
// (fake-gcs-server on loopback, the built CLI, the generated fixtures). Not part of `npm test`.
import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/faults/soak.ts"],
    globalSetup: ["test/setup/global.ts"],
    testTimeout: 3_600_000,
    hookTimeout: 600_000,
    pool: "forks",
  },
});
