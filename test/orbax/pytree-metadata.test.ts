import { describe, expect, test } from "vitest";
import { makeLeaf } from "../../src/orbax/pytree-metadata.js";

const at = [
  { key: "model", type: "dict" as const },
  { key: "dropout", type: "dict" as const },
];

describe("a _METADATA leaf", () => {
  test("an empty dict Orbax keeps for the tree's structure (AXLearn's parameterless children) is an empty node, not an array", () => {
    const leaf = makeLeaf(at, "Dict", true);
    expect(leaf.isEmptyNode).toBe(true);
    expect(leaf.isArray).toBe(false);
  });

  test("a non-array value with data (a string, a saved iterator) is neither an array nor an empty node", () => {
    expect(makeLeaf(at, "string", false).isEmptyNode).toBe(false);
    expect(makeLeaf(at, "string", false).isArray).toBe(false);
  });

  test("a jax.Array is an array", () => {
    expect(makeLeaf(at, "jax.Array", false).isArray).toBe(true);
    expect(makeLeaf(at, "jax.Array", false).isEmptyNode).toBe(false);
  });
});
