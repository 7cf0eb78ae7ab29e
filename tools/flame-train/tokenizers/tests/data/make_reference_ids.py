#!/usr/bin/env python3
"""Writes reference_ids.json: the ids transformers gives for the test vocabularies in this folder.

Run on a machine with transformers 4.x (its slow, pure-Python tokenizers; transformers 5 dropped
some of them) and sentencepiece, from the repository root:

    python3 tools/flame-train/tokenizers/tests/data/make_reference_ids.py

then commit tools/flame-train/tokenizers/tests/data/reference_ids.json and re-run CMake: the ctest
flame_train_tokenizers_reference exists only when the file does, and compares every case.

What it does: loads clip_l/, clip_g/ (CLIPTokenizer.from_pretrained, so tokenizer_config.json's
pad_token applies as in the diffusers pipelines) and t5/ (T5Tokenizer, legacy and non-legacy),
encodes each text of CORPUS as the pipelines do -- tok(text, padding="max_length",
max_length=N, truncation=True) -- and stores the unpadded ids and their count (the script checks
that the rest is padding with the pad id and a 0 mask). ftfy is blocked so that CLIPTokenizer
takes its BasicTokenizer path, the one flame-train reproduces (ftfy is an optional extra of
transformers; with it, CLIPTokenizer's cleanup differs). The fast tokenizers (CLIPTokenizerFast,
T5TokenizerFast, made from the same files) run too: where their ids differ from the slow ones the
file keeps them as fast_input_ids, for information only (diffusers uses the slow CLIPTokenizer
and T5TokenizerFast; the tests compare against the slow tokenizers).
"""
import json
import os
import sys

sys.modules["ftfy"] = None  # `import ftfy` now raises ImportError: CLIPTokenizer's non-ftfy path

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


# FLAME_REFERENCE_ALLOW_FAST=1: transformers 5, whose CLIPTokenizer / T5Tokenizer are the fast
# (tokenizers-backed) classes diffusers users now get; the file then records them instead (compare
# it with FLAME's ids by hand before committing it: the tests target the slow tokenizers).
ALLOW_FAST = os.environ.get("FLAME_REFERENCE_ALLOW_FAST") == "1"
OUT_PATH = os.environ.get("FLAME_REFERENCE_OUT", os.path.join(HERE, "reference_ids.json"))


def run_suite(name, kind, folder, max_length, slow, fast, extra):
    if slow.is_fast and not ALLOW_FAST:
        sys.exit(f"{type(slow).__name__} is a fast tokenizer in transformers {transformers.__version__}: "
                 "install transformers 4.x (pip install 'transformers<5') for the slow reference")
    cases, differ = [], 0
    for text in CORPUS:
        ids = encode(slow, text, max_length)
        case = {"text": text, "input_ids": ids}
        if fast is not None:
            fast_ids = encode(fast, text, max_length)
            if fast_ids != ids:
                case["fast_input_ids"] = fast_ids
                differ += 1
        cases.append(case)
    print(f"{name}: {len(cases)} cases, fast tokenizer differs on {differ}", file=sys.stderr)
    return dict(name=name, kind=kind, folder=folder, max_length=max_length, pad_id=slow.pad_token_id,
                cases=cases, **extra)


def try_fast(make):
    try:
        return make()
    except Exception as e:  # the fast tokenizer is for comparison only
        print(f"fast tokenizer unavailable: {e}", file=sys.stderr)
        return None


def main():
    suites = []
    for folder, max_length in CLIP_SUITES:
        path = os.path.join(HERE, folder)
        slow = CLIPTokenizer.from_pretrained(path)
        assert getattr(slow, "fix_text", None) is None, "ftfy was not blocked"
        fast = try_fast(lambda: transformers.CLIPTokenizerFast.from_pretrained(path, from_slow=True))
        suites.append(run_suite(f"{folder}/{max_length}", "clip", folder, max_length, slow, fast, {}))
    path = os.path.join(HERE, "t5")
    for legacy, prefix, max_length in T5_SUITES:
        slow = T5Tokenizer.from_pretrained(path, legacy=legacy, add_prefix_space=prefix)
        if getattr(slow, "add_prefix_space", True) != prefix:  # transformers before add_prefix_space
            print(f"skipping add_prefix_space={prefix}: not supported by this transformers", file=sys.stderr)
            continue
        fast = try_fast(lambda: transformers.T5TokenizerFast.from_pretrained(
            path, legacy=legacy, add_prefix_space=prefix, from_slow=True))
        name = f"t5/legacy={legacy}/add_prefix_space={prefix}/{max_length}"
        suites.append(run_suite(name, "t5", "t5", max_length, slow, fast,
                                {"legacy": legacy, "add_prefix_space": prefix}))
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
