#!/usr/bin/env python3
"""Writes reference_ids_transformers5.json: the ids transformers 5 gives for the test vocabularies here.

Run on a machine with transformers 5 (tested: 5.17.0 with tokenizers 0.23.2) and sentencepiece,
from the repository root:

    python3 tools/flame-train/tokenizers/tests/data/make_reference_ids.py

then commit tools/flame-train/tokenizers/tests/data/reference_ids_transformers5.json: the ctest
flame_train_tokenizers_reference compares every case with flame-train's tokenizers.

Why transformers 5: since version 5, CLIPTokenizer and T5Tokenizer are the tokenizers-backed (fast)
classes (the slow Python ones are gone), and that is what diffusers users run today, so
flame-train matches them. What it does: loads clip_l/, clip_g/ (CLIPTokenizer.from_pretrained, so
tokenizer_config.json's pad_token applies as in the diffusers pipelines) and t5/ (T5Tokenizer with
the legacy / add_prefix_space settings of T5_SUITES; transformers 5 ignores both, so all T5 suites
hold the same ids up to truncation), encodes each text of CORPUS as the pipelines do --
tok(text, padding="max_length", max_length=N, truncation=True) -- and stores the unpadded ids (the
script checks that the rest is padding with the pad id and a 0 mask). ftfy is blocked as it was
for the recorded file (transformers 5's CLIPTokenizer does not use it either way).
"""
import json
import os
import sys

sys.modules["ftfy"] = None  # as when the committed file was recorded (no effect in transformers 5)

import sentencepiece  # noqa: E402
import transformers  # noqa: E402
from transformers import CLIPTokenizer, T5Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

WORDS = ("portrait of a woman, highly detailed, cinematic lighting, 8k, masterpiece, best quality, "
         "café naïve Ångström 東京 夜景 😀 (sharp:1.2) [sketch] it's don't 1girl 100% 3.14").split()


def long_prompt(n_words, offset=0):
    return " ".join(WORDS[(i * 7 + offset) % len(WORDS)] for i in range(n_words))


CORPUS = [
    "", " ", "a photo of a cat", "A PHOTO OF A CAT", "MiXeD CaSe TeXt",
    "Hello, world!!! How's it going?? (masterpiece:1.2), [sketch], {cat|dog}",
    "it's we're they've I'm you'll he'd don't IT'S ''s 'sam o'clock rock'n'roll",
    "  multiple   spaces\tand\ttabs\nnewlines\r\n  ", "\u00a0nbsp\u3000ideographic\u2028line\u2029para\u0085nel",
    "café naïve résumé über straße crème brûlée ÉCOLE Ångström", "cafe\u0301 decomposed e\u0301\u0301",
    "😀 🐱‍👤 👍🏽 ❤️ cat😀dog 🇯🇵", "東京の夜景 桜 猫", "こんにちは世界 カメラ", "서울 야경", "中文，标点。「引用」",
    "1girl, 2boys, 100%, 3.14, 2024-11-28, ½ Ⅻ ² ٣ 12345678901234567890",
    "ΟΔΟΣ ΣΑΣ Σ ΑΣ' İstanbul ǅemal ß ẞ ﬁ Ω K", "a\x00b\x01c\u200bd\ufeffe\ufffdf\x7fg\ue000h",
    "<|startoftext|>hello<|endoftext|>", "<|ENDOFTEXT|> upper <|StartOfText|>",
    "a cat</s> <pad> <unk> b <extra_id_0> x <extra_id_99> <extra_id_100>", "<extra_id_5>start",
    "hello! wow!!! yes!", "▁underline ▁ text▁", "ＡＢＣ １２３ ｶﾀｶﾅ", "x^2 + y_1 = z; a->b => c ~~ `code` \\path",
    "#hashtag @user e-mail http://example.com/a?b=c&d=e", "مرحبا بالعالم שלום สวัสดี नमस्ते",
    "a" * 300, "The " * 40 + "end", long_prompt(120), long_prompt(700, 3),
    "score_9, score_8_up, BREAK, (((best quality))), <lora:style:0.8>",
]

CLIP_SUITES = [("clip_l", 77), ("clip_g", 77), ("clip_l", 16)]
T5_SUITES = [(True, True, 512), (True, True, 256), (True, True, 77), (False, True, 512), (False, False, 77)]


def encode(tok, text, max_length):
    enc = tok(text, padding="max_length", max_length=max_length, truncation=True)
    ids, mask = list(enc["input_ids"]), list(enc["attention_mask"])
    n = sum(mask)
    assert len(ids) == max_length and mask == [1] * n + [0] * (max_length - n), (text, ids, mask)
    assert all(i == tok.pad_token_id for i in ids[n:]), (text, ids)
    return ids[:n]


OUT_PATH = os.environ.get("FLAME_REFERENCE_OUT", os.path.join(HERE, "reference_ids_transformers5.json"))


def run_suite(name, kind, folder, max_length, tok, extra):
    cases = [{"text": text, "input_ids": encode(tok, text, max_length)} for text in CORPUS]
    print(f"{name}: {len(cases)} cases", file=sys.stderr)
    return dict(name=name, kind=kind, folder=folder, max_length=max_length, pad_id=tok.pad_token_id,
                cases=cases, **extra)


def main():
    if int(transformers.__version__.split(".")[0]) < 5:
        sys.exit(f"transformers {transformers.__version__}: flame-train matches transformers 5 "
                 "(pip install 'transformers>=5')")
    suites = []
    for folder, max_length in CLIP_SUITES:
        tok = CLIPTokenizer.from_pretrained(os.path.join(HERE, folder))
        suites.append(run_suite(f"{folder}/{max_length}", "clip", folder, max_length, tok, {}))
    path = os.path.join(HERE, "t5")
    for legacy, prefix, max_length in T5_SUITES:
        tok = T5Tokenizer.from_pretrained(path, legacy=legacy, add_prefix_space=prefix)
        name = f"t5/legacy={legacy}/add_prefix_space={prefix}/{max_length}"
        suites.append(run_suite(name, "t5", "t5", max_length, tok, {"legacy": legacy, "add_prefix_space": prefix}))
    try:
        import tokenizers
        tokenizers_version = tokenizers.__version__
    except ImportError:
        tokenizers_version = None
    import unicodedata
    out = {"transformers_version": transformers.__version__, "tokenizers_version": tokenizers_version,
           "sentencepiece_version": sentencepiece.__version__, "unicode_version": unicodedata.unidata_version,
           "python_version": sys.version.split()[0], "ftfy": "blocked", "suites": suites}
    with open(OUT_PATH, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print("wrote", OUT_PATH, file=sys.stderr)


if __name__ == "__main__":
    main()
