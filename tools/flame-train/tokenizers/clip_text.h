// The text side of transformers' slow CLIPTokenizer, before BPE (its non-ftfy path, the one taken
// when the optional ftfy package is not installed):
//
//  1. clean_clip_text: BasicTokenizer(strip_accents=False, do_split_on_punc=False).tokenize():
//     drop NUL, U+FFFD and control/format/unassigned characters (category C*, except \t \n \r),
//     turn \t \n \r and Zs into spaces, put spaces around CJK ideographs, NFC, split on Python
//     whitespace, lowercase each word with str.lower(), join with single spaces.
//  2. clip_pre_tokenize: re.findall of
//       <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
//     (IGNORECASE), written out by hand: at each position the alternatives are tried in order;
//     a position none matches (whitespace) is skipped.
#pragma once

#include <string>
#include <vector>

namespace flame_train {

std::u32string clean_clip_text(const std::u32string& text);
std::vector<std::u32string> clip_pre_tokenize(const std::u32string& cleaned);

}  // namespace flame_train
