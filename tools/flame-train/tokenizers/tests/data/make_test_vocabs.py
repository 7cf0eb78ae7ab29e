#!/usr/bin/env python3
"""Makes the small tokenizer files the flame-train tokenizer tests load (run from anywhere):

    python3 tools/flame-train/tokenizers/tests/data/make_test_vocabs.py

No real vocabulary can be downloaded where the tests run, so these are small ones in the real file
formats, made deterministically from a generated caption corpus (3,000 lines, not kept):

  clip_l/  vocab.json + merges.txt (CLIP's byte-level BPE layout: the 256 byte symbols in
           bytes_to_unicode order, the same 256 with "</w>", one entry per merge, then
           <|startoftext|> and <|endoftext|>), tokenizer_config.json with pad_token <|endoftext|>
           (as CLIP-L's tokenizer/ folder in diffusers pipelines)
  clip_g/  the same vocabulary and merges, pad_token "!" (as SDXL's tokenizer_2/)
  t5/      spiece.model: a SentencePiece unigram model trained by Debian's spm_train (package
           sentencepiece) with T5's special ids (<pad> 0, </s> 1, <unk> 2, no BOS) and T5's
           nmt_nfkc normalization; tokenizer_config.json as Flux's tokenizer_2/ (legacy, 512)

The BPE merges are learned here with plain Python (stdlib only): count adjacent symbol pairs over
the corpus words, merge the most frequent (ties: the smaller pair), 400 times. The word split only
approximates CLIP's pre-tokenizer; that is fine, it only decides which merges exist. The ids the
tests compare against come from transformers loading these same files (make_reference_ids.py).
"""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NUM_MERGES = 400
SPM_VOCAB_SIZE = 400

WORDS = """a an the of with and in on at by photo portrait painting of cat dog woman man girl boy
castle forest river mountain city street night day sunset sunrise light shadow red green blue
golden silver black white dark bright soft sharp detailed highly realistic cinematic lighting
studio masterpiece best quality illustration anime style oil canvas watercolor sketch digital art
trending artstation octane render unreal engine 8k 4k hdr bokeh depth field wide angle close up
standing sitting walking running flying smiling looking viewer background foreground sky cloud
rain snow fire water ocean beach flower tree garden house room window door table chair book
it's don't we're they've i'm you'll he'd café naïve résumé über straße crème brûlée façade
jalapeño piñata smörgåsbord ångström élan déjà vu señor mañana""".split()
EXTRA = ["東京", "夜景", "桜", "猫", "山", "こんにちは", "カメラ", "서울", "москва", "αθήνα",
         "1girl", "2boys", "100%", "(masterpiece:1.2)", "[sketch]", "{cat|dog}", "--ar", "16:9",
         "3.14", "2024", "#hashtag", "@user", "e-mail", "ü", "é", "ñ", "ß"]


def lcg(seed):
    """A fixed pseudo-random stream (the corpus must not depend on Python's random module)."""
    state = seed
    while True:
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        yield state >> 33


def make_corpus(lines=3000):
    rnd = lcg(20261128)
    out = []
    pool = WORDS + EXTRA
    for _ in range(lines):
        n = 4 + next(rnd) % 14
        words = []
        for _ in range(n):
            w = pool[next(rnd) % len(pool)]
            r = next(rnd) % 10
            if r == 0:
                w = w.capitalize()
            elif r == 1:
                w = w.upper()
            words.append(w)
        sep = ", " if next(rnd) % 3 == 0 else " "
        out.append(sep.join(words) + ("." if next(rnd) % 4 == 0 else ""))
    return out


def bytes_to_unicode():
    """CLIP's (and GPT-2's) reversible byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def learn_merges(corpus):
    byte_map = bytes_to_unicode()
    counts = {}
    for line in corpus:
        for w in re.findall(r"'s|'t|'re|'ve|'m|'ll|'d|[^\W\d_]+|\d|[^\s\w]+|_", line.lower()):
            sym = tuple(byte_map[b] for b in w.encode("utf-8"))
            sym = sym[:-1] + (sym[-1] + "</w>",)
            counts[sym] = counts.get(sym, 0) + 1
    merges = []
    for _ in range(NUM_MERGES):
        pairs = {}
        for sym, c in counts.items():
            for p in zip(sym, sym[1:]):
                pairs[p] = pairs.get(p, 0) + c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = {}
        for sym, c in counts.items():
            out, i = [], 0
            while i < len(sym):
                if i + 1 < len(sym) and (sym[i], sym[i + 1]) == best:
                    out.append(sym[i] + sym[i + 1])
                    i += 2
                else:
                    out.append(sym[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        counts = merged
    return merges


def write_clip(folder, merges, pad_token):
    os.makedirs(folder, exist_ok=True)
    base = list(bytes_to_unicode().values())
    vocab = base + [v + "</w>" for v in base] + ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    encoder = {}
    for tok in vocab:  # a merge result can repeat an earlier entry: the first id stays
        encoder.setdefault(tok, len(encoder))
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(encoder, f, ensure_ascii=False, indent=0)
        f.write("\n")
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")
    config = {"tokenizer_class": "CLIPTokenizer", "model_max_length": 77, "do_lower_case": True,
              "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
              "unk_token": "<|endoftext|>", "pad_token": pad_token}
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def write_t5(folder, corpus):
    os.makedirs(folder, exist_ok=True)
    # The model records its trainer options (input and prefix included): fixed relative names, run
    # in the output folder, keep the file byte-identical from run to run. The corpus is not kept.
    with open(os.path.join(folder, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(corpus) + "\n")
    try:
        subprocess.run(["spm_train", "--input=corpus.txt", "--model_prefix=spiece",
                        f"--vocab_size={SPM_VOCAB_SIZE}", "--model_type=unigram",
                        "--character_coverage=0.9995", "--normalization_rule_name=nmt_nfkc",
                        "--pad_id=0", "--eos_id=1", "--unk_id=2", "--bos_id=-1",
                        "--num_threads=1", "--shuffle_input_sentence=false",
                        "--input_sentence_size=0", "--minloglevel=2"], check=True, cwd=folder)
    finally:
        for name in ("corpus.txt", "spiece.vocab"):
            if os.path.exists(os.path.join(folder, name)):
                os.remove(os.path.join(folder, name))
    config = {"tokenizer_class": "T5Tokenizer", "model_max_length": 512, "legacy": True,
              "add_prefix_space": True, "extra_ids": 100, "eos_token": "</s>",
              "unk_token": "<unk>", "pad_token": "<pad>"}
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def main():
    corpus = make_corpus()
    merges = learn_merges(corpus)
    write_clip(os.path.join(HERE, "clip_l"), merges, "<|endoftext|>")
    write_clip(os.path.join(HERE, "clip_g"), merges, "!")
    write_t5(os.path.join(HERE, "t5"), corpus)
    print(f"{len(corpus)} corpus lines, {len(merges)} merges, spm vocabulary {SPM_VOCAB_SIZE}", file=sys.stderr)


if __name__ == "__main__":
    main()
