/**
 * The converter's defaults on one machine, in one place for the library and the CLI's flags: objects in
 * flight, and the bound on bytes buffered at once (MiB). (The Cloud Run jobs default higher: they run alone
 * on a big machine; jobs/main.ts.) A module of its own so that the CLI reads them without loading the engine.
 */
export const DEFAULT_CONCURRENCY = 16;
export const DEFAULT_MEMORY_MIB = 256;

/** Upper bounds for settings read from the environment: they only reject nonsense. */
export const MAX_CONCURRENCY = 65_536;
export const MAX_MEMORY_MIB = 16 * 1024 * 1024;

/** MiB to bytes. Not `<< 20`: that wraps at 2048 MiB (32-bit), giving a negative or zero budget. */
export const mibToBytes = (mib: number): number => mib * 2 ** 20;
