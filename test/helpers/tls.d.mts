// Types of tls.mjs (plain JavaScript, shared with the benchmarks).
export declare const TLS_DIR: string;

export interface TestTls {
  readonly dir: string;
  readonly caFile: string;
  readonly certFile: string;
  readonly keyFile: string;
  readonly ca: Buffer;
  readonly cert: Buffer;
  readonly key: Buffer;
}

export declare function testTls(): TestTls;
export declare function serverTls(): { key: Buffer; cert: Buffer };
export declare function clientTls(): { ca: Buffer };
export declare function trustTestCa<E extends Record<string, string | undefined>>(env?: E): E;
export declare function trusted(): boolean;
export declare function runTrustingTestCa(): Promise<void>;
export declare function answersOk(url: string, timeoutMs?: number): Promise<boolean>;
