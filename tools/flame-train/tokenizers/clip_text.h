// The text side of CLIP's tokenizer before BPE, as transformers 5's CLIPTokenizer runs it (the
// tokenizers-backed class; its pipeline is the one CLIPConverter builds from vocab.json and
// merges.txt). It is applied to each stretch of text between special tokens:
//
//  1. normalize_clip_text: NFC, every run of Unicode White_Space (Oniguruma's \s) becomes one
//     space, then each character is lowercased on its own (no final-sigma rule). Nothing is
//     dropped: control and format characters (NUL, U+200B, U+FEFF, ...) stay and reach BPE as
//     bytes, and CJK ideographs get no spaces around them (transformers 4's slow class differed).
//  2. clip_pre_tokenize: the Split pre-tokenizer's matches of
//       's|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
//     (case-sensitive; the text is lowercase already), written out by hand: at each position the
//     alternatives are tried in order; a position none matches (whitespace) is skipped. The
//     ByteLevel pre-tokenizer that follows splits these pieces no further (they hold no
//     whitespace), so only its byte mapping remains, done in clip_tokenizer.cpp.
// The special tokens themselves are not in this regex: spelled in another case they are
// ordinary text ("<|ENDOFTEXT|>" -> "<|", "endoftext", "|>").
#pragma once

#include <string>
#include <vector>

namespace flame_train {

std::u32string normalize_clip_text(const std::u32string& text);
std::vector<std::u32string> clip_pre_tokenize(const std::u32string& normalized);

}  // namespace flame_train
