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

}  // namespace
