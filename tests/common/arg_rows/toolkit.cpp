// Argument-matrix rows (tests/common/arg_matrix.h) for the training toolkit: optimizer state files,
// gradient tools, the loss scaler, LoRA adapters and gradient checkpointing.
#include <cstdio>
#include <string>
#include "arg_matrix.h"

namespace {
using namespace argm;

// The path of a valid optimizer state file for a.opt's optimizer (SGD with default options over one
// f32 [2, 3] parameter, never stepped: metadata only), written by hand into Args' directory in
// Live mode, so that no row needs another optimizer to make it.
const char* optim_state_path(Args& a, const char* name) {
  const char* p = a.out_path(name);
  if (!p || a.mode() != Mode::Live) return p;
  const std::string meta =
      "{\\\"groups\\\":[{\\\"amsgrad\\\":0,\\\"beta1\\\":0.9,\\\"beta2\\\":0.999,\\\"dampening\\\":0.0,\\\"eps\\\":1e-08,"
      "\\\"lr\\\":0.001,\\\"master_weights\\\":0,\\\"maximize\\\":0,\\\"momentum\\\":0.0,\\\"nesterov\\\":0,"
      "\\\"params\\\":[{\\\"dtype\\\":\\\"f32\\\",\\\"shape\\\":[2,3]}],\\\"stochastic_rounding\\\":0,"
      "\\\"weight_decay\\\":0.0}],\\\"kind\\\":\\\"sgd\\\",\\\"rounding_rng\\\":null,\\\"step\\\":0,\\\"version\\\":1}";
  const std::string json = "{\"__metadata__\":{\"flame.optimizer_state\":\"" + meta + "\"}}";
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>(static_cast<uint64_t>(json.size()) >> (8 * i)));
  bytes += json;
  if (FILE* f = std::fopen(p, "wb")) {
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  return p;
}

// ---- optimizer state files ----
FLAME_ARG_ROW(flame_optimizer_save_state, a.opt("opt"), a.out_path("path"));
FLAME_ARG_ROW(flame_optimizer_load_state, a.opt("opt"), optim_state_path(a, "path"));


// ---- gradient tools: two f32 tensors (one [4] f64) of ctx; stats_host gets room for 3 rows ----
FLAME_ARG_ROW(flame_grad_normalize, a.ctx("ctx"), a.ts("tensors", {sp(), sp({4}, FLAME_DTYPE_F64)}), 2, 1.0, 1e-6);
FLAME_ARG_ROW(flame_grad_add_noise, a.ctx("ctx"), a.ts("tensors", {sp(), sp({4}, FLAME_DTYPE_F64)}), 2, 0.1);
FLAME_ARG_ROW(flame_grad_stats, a.ctx("ctx"), a.ts("tensors", {sp(), sp({4}, FLAME_DTYPE_F64)}), 2, a.out_t("out"));
FLAME_ARG_ROW(flame_grad_stats_host, a.ctx("ctx"), a.ts("tensors", {sp(), sp({4}, FLAME_DTYPE_F64)}), 2,
              a.out<double>("values", 3 * FLAME_STAT_COLUMNS), 3 * FLAME_STAT_COLUMNS);


// ---- loss scaler: a.scaler has default options; a.opt is an SGD optimizer with a .grad of ones ----
const flame_grad_scaler_options_t* scaler_opts(Args& a) {  // may be NULL by contract: never NULLed
  auto* o = a.opt_out<flame_grad_scaler_options_t>("opts");
  if (o) flame_grad_scaler_options_init(o);
  return o;
}
// A scaler that has recorded an Inf check (of an empty list), so that update is valid.
flame_grad_scaler_t checked_scaler(Args& a) {
  flame_grad_scaler_t s = a.scaler("scaler");
  if (s && a.mode() == Mode::Live) flame_grad_scaler_unscale_tensors(s, nullptr, 0);
  return s;
}
// A merged adapter, so that unmerge is valid.
flame_lora_t merged_lora(Args& a) {
  flame_lora_t l = a.lora("lora");
  if (l && a.mode() == Mode::Live) flame_lora_merge(l);
  return l;
}
FLAME_ARG_ROW(flame_grad_scaler_options_init, a.out<flame_grad_scaler_options_t>("opts"));
FLAME_ARG_ROW(flame_grad_scaler_create, a.ctx("ctx"), scaler_opts(a), a.out_scaler("out"));
FLAME_ARG_VOID(flame_grad_scaler_release, a.release_scaler("scaler"));
FLAME_ARG_ROW(flame_grad_scaler_scale, a.scaler("scaler"), a.t("loss", loss()), a.out_t("out"));
FLAME_ARG_ROW(flame_grad_scaler_unscale, a.scaler("scaler"), a.opt("opt"));
FLAME_ARG_ROW(flame_grad_scaler_unscale_tensors, a.scaler("scaler"), a.ts("tensors", {sp(), sp({4}, FLAME_DTYPE_F64)}), 2);
FLAME_ARG_ROW(flame_grad_scaler_step, a.scaler("scaler"), a.opt("opt"), a.opt_out<int32_t>("stepped"));
FLAME_ARG_ROW(flame_grad_scaler_update, checked_scaler(a));
FLAME_ARG_ROW(flame_grad_scaler_get_scale, a.scaler("scaler"), a.out<double>("scale"));
FLAME_ARG_ROW(flame_grad_scaler_found_inf, a.scaler("scaler"), a.out_t("out"));
FLAME_ARG_ROW(flame_grad_scaler_get_state, a.scaler("scaler"), a.out<double>("scale"), a.out<int64_t>("growth_tracker"));
FLAME_ARG_ROW(flame_grad_scaler_set_state, a.scaler("scaler"), 1024.0, 0);


// ---- LoRA: a.lora is a rank-2 adapter over an f32 [4, 3] weight with a [4] bias ----
FLAME_ARG_ROW(flame_lora_create, a.t("weight", sp({4, 3})), a.opt_t("bias", sp({4})), 2, 4.0, a.out_lora("out"));
FLAME_ARG_VOID(flame_lora_release, a.release_lora("lora"));
FLAME_ARG_ROW(flame_lora_forward, a.lora("lora"), a.t("x"), a.out_t("out"));
FLAME_ARG_ROW(flame_lora_adapters, a.lora("lora"), a.out_t("a"), a.out_t("b"));
FLAME_ARG_ROW(flame_lora_merge, a.lora("lora"));
FLAME_ARG_ROW(flame_lora_unmerge, merged_lora(a));
FLAME_ARG_ROW(flame_lora_is_merged, a.lora("lora"), a.out<int32_t>("merged"));


// ---- gradient checkpointing: a block squaring its one input ----
flame_status_t square_block(void*, const flame_tensor_t* inputs, int32_t, flame_tensor_t* outputs, int32_t) {
  return flame_mul(inputs[0], inputs[0], &outputs[0]);
}
FLAME_ARG_ROW(flame_checkpoint, a.ctx("ctx"), a.fn("fn", &square_block), nullptr, nullptr, a.ts("inputs", {grad_leaf()}), 1,
              a.outs("outputs", 1), 1);

}  // namespace
