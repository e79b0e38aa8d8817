// Filled in as tests need services (fake-gcs-server) and generated fixtures.
export default async function setup(): Promise<() => Promise<void>> {
  return async () => {};
}
