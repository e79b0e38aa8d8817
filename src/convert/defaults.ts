/**
 * The converter's defaults on one machine, in one place for the library and the CLI's flags: objects in
 * flight, and the bound on bytes buffered at once (MiB). (The Cloud Run jobs default higher: they run alone
 * on a big machine; jobs/main.ts.) A module of its own so that the CLI reads them without loading the engine.
 */
export const DEFAULT_CONCURRENCY = 16;
export const DEFAULT_MEMORY_MIB = 256;
