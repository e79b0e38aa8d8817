import protobuf from "protobufjs";
import { FormatError } from "../errors.js";

/**
 * A sentencepiece model file (`*.model`): a serialized `ModelProto` of sentencepiece_model.proto
 * (github.com/google/sentencepiece/blob/master/src/sentencepiece_model.proto). Decoded with protobufjs from the
 * fields this project reads, with the proto's own numbers and defaults (proto2: an absent field is its
 * default, e.g. remove_extra_whitespaces true, which AXLearn's models set false).
 */

/** SentencePiece.Type: how a piece takes part in encoding. */
export type PieceType = "normal" | "unknown" | "control" | "user_defined" | "unused" | "byte";
const PIECE_TYPES: Record<number, PieceType> = { 1: "normal", 2: "unknown", 3: "control", 4: "user_defined", 5: "unused", 6: "byte" };
/** TrainerSpec.ModelType. */
export type ModelType = "unigram" | "bpe" | "word" | "char";
const MODEL_TYPES: Record<number, ModelType> = { 1: "unigram", 2: "bpe", 3: "word", 4: "char" };

export interface Piece {
  readonly piece: string;
  readonly score: number;
  readonly type: PieceType;
}

export interface SentencePieceModel {
  readonly pieces: readonly Piece[];
  readonly modelType: ModelType;
  readonly byteFallback: boolean;
  readonly treatWhitespaceAsSuffix: boolean;
  readonly unkPiece: string;
  /** trainer_spec's eos_id and pad_id: -1 when the model has none. */
  readonly eosId: number;
  readonly padId: number;
  readonly normalizer: {
    readonly name: string;
    /** Non-empty for the nmt_nfkc-style rules: a compiled character map. */
    readonly precompiledCharsmap: Uint8Array;
    readonly addDummyPrefix: boolean;
    readonly removeExtraWhitespaces: boolean;
    readonly escapeWhitespaces: boolean;
  };
}

// The fields read, with sentencepiece_model.proto's numbers and defaults; every other field is skipped.
const root = protobuf.Root.fromJSON({
  nested: {
    ModelProto: {
      fields: {
        pieces: { rule: "repeated", type: "SentencePiece", id: 1 },
        trainerSpec: { type: "TrainerSpec", id: 2 },
        normalizerSpec: { type: "NormalizerSpec", id: 3 },
      },
      nested: {
        SentencePiece: {
          fields: {
            piece: { type: "string", id: 1 },
            score: { type: "float", id: 2 },
            type: { type: "int32", id: 3, options: { default: 1 } },
          },
        },
      },
    },
    TrainerSpec: {
      fields: {
        modelType: { type: "int32", id: 3, options: { default: 1 } },
        treatWhitespaceAsSuffix: { type: "bool", id: 24, options: { default: false } },
        byteFallback: { type: "bool", id: 35, options: { default: false } },
        eosId: { type: "int32", id: 42, options: { default: 2 } },
        padId: { type: "int32", id: 43, options: { default: -1 } },
        unkPiece: { type: "string", id: 45, options: { default: "<unk>" } },
      },
    },
    NormalizerSpec: {
      fields: {
        name: { type: "string", id: 1 },
        precompiledCharsmap: { type: "bytes", id: 2 },
        addDummyPrefix: { type: "bool", id: 3, options: { default: true } },
        removeExtraWhitespaces: { type: "bool", id: 4, options: { default: true } },
        escapeWhitespaces: { type: "bool", id: 5, options: { default: true } },
      },
    },
  },
});
const ModelProto = root.lookupType("ModelProto");

interface Decoded {
  pieces?: { piece?: string; score?: number; type?: number }[];
  trainerSpec?: {
    modelType: number;
    treatWhitespaceAsSuffix: boolean;
    byteFallback: boolean;
    eosId: number;
    padId: number;
    unkPiece: string;
  };
  normalizerSpec?: {
    name: string;
    precompiledCharsmap: Uint8Array;
    addDummyPrefix: boolean;
    removeExtraWhitespaces: boolean;
    escapeWhitespaces: boolean;
  };
}

/** Decodes a `.model` file's bytes; `path` names it in errors. */
export function parseSentencePieceModel(bytes: Uint8Array, path: string): SentencePieceModel {
  let m: Decoded;
  try {
    // toObject with defaults: absent proto2 fields take the schema's defaults above.
    m = ModelProto.toObject(ModelProto.decode(bytes), { defaults: true }) as Decoded;
  } catch (e) {
    throw new FormatError(`not a sentencepiece model (${(e as Error).message})`, { path });
  }
  const pieces = (m.pieces ?? []).map((p, i) => {
    const type = PIECE_TYPES[p.type ?? 1];
    if (type === undefined) throw new FormatError(`piece ${i} has unknown type ${p.type}`, { path });
    return { piece: p.piece ?? "", score: p.score ?? 0, type };
  });
  if (pieces.length === 0 || m.trainerSpec === undefined || m.normalizerSpec === undefined)
    throw new FormatError("not a sentencepiece model (no pieces, trainer_spec or normalizer_spec)", { path });
  const modelType = MODEL_TYPES[m.trainerSpec.modelType];
  if (modelType === undefined) throw new FormatError(`trainer_spec.model_type ${m.trainerSpec.modelType} is unknown`, { path });
  const n = m.normalizerSpec;
  return {
    pieces,
    modelType,
    byteFallback: m.trainerSpec.byteFallback,
    treatWhitespaceAsSuffix: m.trainerSpec.treatWhitespaceAsSuffix,
    unkPiece: m.trainerSpec.unkPiece,
    eosId: m.trainerSpec.eosId,
    padId: m.trainerSpec.padId,
    normalizer: {
      name: n.name,
      precompiledCharsmap: new Uint8Array(n.precompiledCharsmap),
      addDummyPrefix: n.addDummyPrefix,
      removeExtraWhitespaces: n.removeExtraWhitespaces,
      escapeWhitespaces: n.escapeWhitespaces,
    },
  };
}
