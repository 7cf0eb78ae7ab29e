// T5 encoder keys (see t5_keys.h): the parameter list of T5EncoderModel in transformers' order, and
// detection of the configuration from a key list's shapes.
#include "models/t5_keys.h"
#include "core/error.h"

namespace flame::models {

namespace {

const char* const kPrefixes[] = {"", "text_encoders.t5xxl.transformer."};
const char* const kMarker = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight";

bool t5_at(const KeyIndex& idx, const std::string& pre) {
  return idx.has(pre + kMarker) && idx.has(pre + "encoder.final_layer_norm.weight");
}

}  // namespace

MappedTable t5_parameter_table(const T5Config& c) {
  const std::string& ff = c.feed_forward_proj;
  FLAME_CHECK(ff == "relu" || ff == "gelu" || ff == "gated-gelu" || ff == "gated-relu" || ff == "gated-silu",
              FLAME_ERROR_INVALID_ARGUMENT, "T5 configuration: feed_forward_proj '", ff, "' is not supported");
  FLAME_CHECK(c.num_layers >= 1 && c.num_heads >= 1 && c.d_kv >= 1, FLAME_ERROR_INVALID_ARGUMENT,
              "T5 configuration: layers, heads and d_kv must be positive");
  const int64_t d = c.d_model, inner = c.num_heads * c.d_kv;
  MappedTableBuilder b;
  auto own = [&](const std::string& name, std::vector<int64_t> shape) { b.same(name, name, shape); };
  own("shared.weight", {c.vocab_size, d});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string blk = "encoder.block." + std::to_string(i) + ".layer.";
    own(blk + "0.SelfAttention.q.weight", {inner, d});
    own(blk + "0.SelfAttention.k.weight", {inner, d});
    own(blk + "0.SelfAttention.v.weight", {inner, d});
    own(blk + "0.SelfAttention.o.weight", {d, inner});
    if (i == 0)
      own(blk + "0.SelfAttention.relative_attention_bias.weight", {c.relative_attention_num_buckets, c.num_heads});
    own(blk + "0.layer_norm.weight", {d});
    if (c.is_gated()) {
      own(blk + "1.DenseReluDense.wi_0.weight", {c.d_ff, d});
      own(blk + "1.DenseReluDense.wi_1.weight", {c.d_ff, d});
    } else {
      own(blk + "1.DenseReluDense.wi.weight", {c.d_ff, d});
    }
    own(blk + "1.DenseReluDense.wo.weight", {d, c.d_ff});
    own(blk + "1.layer_norm.weight", {d});
  }
  own("encoder.final_layer_norm.weight", {d});
  return b.take();
}

bool is_t5_checkpoint(const std::vector<KeyShape>& keys) {
  const KeyIndex idx(keys, "T5");
  for (const char* p : kPrefixes)
    if (t5_at(idx, p)) return true;
  return false;
}

T5Checkpoint detect_t5_checkpoint(const std::vector<KeyShape>& keys) {
  const KeyIndex idx(keys, "T5");
  T5Checkpoint ck;
  bool found = false;
  for (const char* p : kPrefixes) {
    if (t5_at(idx, p)) {
      ck.prefix = p;
      found = true;
      break;
    }
  }
  FLAME_CHECK(found, FLAME_ERROR_INVALID_FORMAT, "not a T5 encoder checkpoint: no ", kMarker,
              " with encoder.final_layer_norm.weight, with or without the prefix text_encoders.t5xxl.transformer.");
  const std::string& pre = ck.prefix;
  T5Config& c = ck.config;
  if (!idx.has(pre + "shared.weight") && idx.has(pre + "encoder.embed_tokens.weight"))
    ck.embedding_name = "encoder.embed_tokens.weight";
  const KeyShape& embedding = idx.need(pre + ck.embedding_name, 2);
  c.vocab_size = embedding.shape[0];
  c.d_model = embedding.shape[1];
  const KeyShape& bias = idx.need(pre + kMarker, 2);
  c.relative_attention_num_buckets = bias.shape[0];
  c.num_heads = bias.shape[1];
  const std::string first = pre + "encoder.block.0.layer.";
  const KeyShape& q = idx.need(first + "0.SelfAttention.q.weight", 2);
  FLAME_CHECK(c.num_heads > 0 && q.shape[0] > 0 && q.shape[0] % c.num_heads == 0, FLAME_ERROR_INVALID_FORMAT, "T5 tensor ", q.name,
              " has ", q.shape[0], " rows, not a multiple of the ", c.num_heads, " heads of ", bias.name);
  c.d_kv = q.shape[0] / c.num_heads;
  const bool gated = idx.has(first + "1.DenseReluDense.wi_0.weight");
  c.feed_forward_proj = gated ? "gated-gelu" : "relu";
  c.d_ff = idx.need(first + (gated ? "1.DenseReluDense.wi_0.weight" : "1.DenseReluDense.wi.weight"), 2).shape[0];
  c.num_layers = idx.count_indices(pre + "encoder.block.");
  MappedTable table = t5_parameter_table(c);
  std::vector<KeyShape> want = table.diffusers_tensors();
  want.front().name = ck.embedding_name;  // shared.weight comes first
  idx.expect_all(want, pre,
                 "a T5 encoder of " + std::to_string(c.num_layers) + " blocks of width " + std::to_string(c.d_model));
  return ck;
}

}  // namespace flame::models
