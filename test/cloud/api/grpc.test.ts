import { describe, expect, it } from "vitest";
import { Code, codeOf, isNotFound, isPermanent, isUnavailable, retryCall } from "../../../src/cloud/api/grpc.js";

const failing = (code: unknown) => Object.assign(new Error(`code ${String(code)}`), { code });

describe("gRPC status codes", () => {
  it("are google.rpc.Code's numbers", () => {
    expect(Object.values(Code)).toEqual([...Array(17).keys()]);
    expect([Code.INVALID_ARGUMENT, Code.NOT_FOUND, Code.FAILED_PRECONDITION, Code.UNAVAILABLE]).toEqual([3, 5, 9, 14]);
  });

  it("a code is read only when it is a number (Node's socket errors carry strings)", () => {
    expect(codeOf(failing(14))).toBe(14);
    expect(codeOf(failing("ECONNREFUSED"))).toBeUndefined();
    expect(codeOf(undefined)).toBeUndefined();
  });

  it("each class accepts the gRPC code and the HTTP status that stands for it", () => {
    const classes = (code: number) => [isNotFound, isPermanent, isUnavailable].filter((f) => f(failing(code))).map((f) => f.name);
    expect(classes(Code.NOT_FOUND)).toEqual(["isNotFound", "isPermanent"]);
    expect(classes(404)).toEqual(["isNotFound", "isPermanent"]);
    for (const c of [Code.INVALID_ARGUMENT, Code.FAILED_PRECONDITION, 400]) expect(classes(c)).toEqual(["isPermanent"]);
    for (const c of [Code.DEADLINE_EXCEEDED, Code.UNAVAILABLE, 503, 504]) expect(classes(c)).toEqual(["isUnavailable"]);
    for (const c of [Code.PERMISSION_DENIED, Code.INTERNAL, Code.UNKNOWN, 403, 500]) expect(classes(c)).toEqual([]);
  });
});

describe("retryCall", () => {
  const policy = { tries: 3, delayMs: () => 1, retryable: isUnavailable };

  it("tries again after a retryable failure", async () => {
    let calls = 0;
    const call = async () => {
      if (++calls < 3) throw failing(Code.UNAVAILABLE);
      return "ok";
    };
    await expect(retryCall(call, policy)).resolves.toBe("ok");
    expect(calls).toBe(3);
  });

  it("throws the last failure as it is once the tries are used up", async () => {
    let calls = 0;
    const call = async () => {
      throw failing(++calls);
    };
    await expect(retryCall(call, { ...policy, retryable: () => true })).rejects.toMatchObject({ code: 3 });
  });

  it("does not retry a failure the policy does not call retryable", async () => {
    let calls = 0;
    const call = async () => {
      calls++;
      throw failing(Code.PERMISSION_DENIED);
    };
    await expect(retryCall(call, policy)).rejects.toMatchObject({ code: Code.PERMISSION_DENIED });
    expect(calls).toBe(1);
  });
});
