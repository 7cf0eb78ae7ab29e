// Caption handling (flame-train), as kohya's sd-scripts does it (train_util.process_caption):
//
//   1. caption dropout: with probability dropout_rate the whole caption becomes "" (the
//      unconditional example);
//   2. otherwise, when shuffling or tag dropout is on, the caption is split at the separator
//      (default ","), each tag trimmed, empty tags dropped; the first keep_tokens tags stay fixed
//      in front (kohya's keep_tokens: e.g. a trigger word), the rest are shuffled, then each of
//      them is dropped with probability tag_dropout_rate; the tags are joined with ", ".
//
// Every draw comes from RandomStream keyed by (seed, epoch, item): the same caption of the same
// item in the same epoch always comes out the same; another epoch gives another order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flame_train {

struct CaptionOptions {
  double dropout_rate = 0.0;      // [0, 1]: probability of an empty caption
  double tag_dropout_rate = 0.0;  // [0, 1]: probability of dropping each non-fixed tag
  bool shuffle = false;           // shuffle the non-fixed tags
  int keep_tokens = 0;            // leading tags that never move nor drop
  std::string separator = ",";    // tag separator (non-empty)
};

// Splits at separator, trims ASCII whitespace around each tag and drops empty tags.
std::vector<std::string> split_tags(const std::string& caption, const std::string& separator);

// The caption of one item in one epoch after dropout, shuffling and tag dropout.
std::string process_caption(const std::string& caption, const CaptionOptions& options, uint64_t seed,
                            uint64_t epoch, uint64_t item);

}  // namespace flame_train
