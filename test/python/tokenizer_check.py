#!/usr/bin/env python3
"""An export's tokenizer, read by its real consumers (test/hf/tokenizer-consumers.test.ts).

    .venv-hf/bin/python test/python/tokenizer_check.py ids FOLDER SENTENCEPIECE_MODEL
        transformers' AutoTokenizer over FOLDER against the `sentencepiece` package (what AXLearn's seqio
        vocabulary wraps) over the .model, with "\\n" replaced by "<n>" first as fuji's training input does
        (axlearn/common/input_text.py tokenize_example): ids on a varied corpus, on every piece of the vocabulary
        standing alone, and on random strings; decoding round trips as sentencepiece's does. Prints JSON.
    .venv-hf/bin/python test/python/tokenizer_check.py generate FOLDER
        AutoTokenizer, AutoModelForCausalLM and pipeline("text-generation") over the export alone; generate from a
        prompt with and without the export's end-of-sequence id. Prints JSON.
"""

import json
import os
import random
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.dont_write_bytecode = True

CORPUS = [
    "Hello world",
    " leading space",
    "  two leading spaces",
    "trailing spaces   ",
    "a   b    c     d",
    "tabs\there\t\tand\t",
    "one\nnewline",
    "\nstarts with a newline",
    "ends with a newline\n",
    "two\n\nnewlines and \n \n spaced ones",
    "\n",
    " ",
    "   ",
    "\t",
    "12345 67.89 1,000,000 3.14159e-10 0x1F 007",
    "def square(x):\n    return x ** 2  # the square\n\n\nprint(square(12))\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}",
    'SELECT "name", COUNT(*) FROM t WHERE id IN (1, 2, 3) GROUP BY 1;',
    "naïve café résumé Ångström",
    "日本語のテキストと漢字",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "emoji 😀🎉👍🏽 👨‍👩‍👧 done",
    "mixed\r\nCRLF\r\nlines",
    "no-break\u00a0space and zero\u200bwidth",
    "<n> typed literally",
    "e=mc² ½ ∑ ∫ ≤ ≥ ≠",
    "ℌ𝔢𝔩𝔩𝔬 𝕨𝕠𝕣𝕝𝕕",
    "x\n y\n  z\n   w",
    "The quick brown fox jumps over the lazy dog. " * 4,
    "https://example.com/a/b?c=d&e=f#g",
    "\\u0041 \\n \\t escaped in source",
    "",
]


def ids_check(folder, model_file):
    import sentencepiece as spm
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    sp = spm.SentencePieceProcessor(model_file=model_file)

    def axlearn(text):
        return sp.encode(text.replace("\n", "<n>"))

    def compare(text):
        want = axlearn(text)
        got = tok(text, add_special_tokens=False).input_ids
        back = tok.decode(got, skip_special_tokens=True)
        sp_back = sp.decode(want).replace("<n>", "\n")
        return want, got, back, sp_back

    out = {"class": type(tok).__name__, "corpus": len(CORPUS), "corpus_diffs": [], "decode_diffs": []}
    for text in CORPUS:
        want, got, back, sp_back = compare(text)
        if want != got:
            out["corpus_diffs"].append({"text": text, "sentencepiece": want, "transformers": got})
        if back != sp_back:
            out["decode_diffs"].append({"text": text, "sentencepiece": sp_back, "transformers": back})
    # Every piece alone: the text that sentencepiece would make that piece from (its dummy prefix added by
    # sentencepiece itself; a piece without "▁" after a newline, which leaves no prefix).
    pieces = diffs = 0
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i) or sp.is_unused(i):
            continue
        piece = sp.id_to_piece(i)
        if "\n" in piece or piece == "<n>":
            continue  # "\n" never reaches sentencepiece once replaced by "<n>"
        pieces += 1
        text = piece.replace("▁", " ")
        text = text[1:] if text.startswith(" ") else "\n" + text
        want, got, _, _ = compare(text)
        if want != got:
            diffs += 1
            if diffs <= 5:
                out.setdefault("piece_diffs", []).append({"piece": piece, "sentencepiece": want, "transformers": got})
    out["pieces"] = pieces
    out["pieces_differing"] = diffs
    # Random strings over a hard alphabet.
    rng = random.Random(43)
    alphabet = list("abcXYZ   \n\n\t0123456789.,;:!?'\"()[]{}<>/\\-_=+*&#@~`|") + [
        "é", "ß", "日", "本", "😀", "🏽", "\u00a0", "\u200b", "<n>", "\r", "Ω", "𝔢", "\u0301",
    ]
    fuzz = fuzz_diffs = 0
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        fuzz += 1
        want, got, back, sp_back = compare(text)
        if want != got or back != sp_back:
            fuzz_diffs += 1
            if fuzz_diffs <= 5:
                out.setdefault("fuzz_examples", []).append({"text": text, "sentencepiece": want, "transformers": got})
    out["fuzz"] = fuzz
    out["fuzz_differing"] = fuzz_diffs
    # With the special tokens a sequence gets: EOS first, as fuji's documents start.
    out["with_special"] = tok("Hello world").input_ids[:2]
    out["special"] = {"bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id}
    out["model_max_length"] = tok.model_max_length
    print(json.dumps(out))


def generate_check(folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    prompt = tok("Hello\nworld", return_tensors="pt")
    stopped = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    # The same model told no end of sequence: it runs to max_new_tokens, so the stop above is the eos id's doing.
    unstopped = model.generate(**prompt, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    pipe = pipeline("text-generation", model=folder)
    generated = pipe("Hello\nworld", max_new_tokens=12, do_sample=False)
    print(
        json.dumps(
            {
                "prompt_ids": prompt.input_ids[0].tolist(),
                "stopped": stopped[0].tolist(),
                "unstopped": unstopped[0].tolist(),
                "generation_config": {
                    "bos": model.generation_config.bos_token_id,
                    "eos": model.generation_config.eos_token_id,
                    "pad": model.generation_config.pad_token_id,
                },
                "pipeline": generated[0]["generated_text"],
            }
        )
    )


if __name__ == "__main__":
    if sys.argv[1] == "ids":
        ids_check(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "generate":
        generate_check(sys.argv[2])
    else:
        sys.exit(f"unknown mode {sys.argv[1]}")
