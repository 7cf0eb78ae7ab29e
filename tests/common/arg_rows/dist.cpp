// Argument-matrix rows (tests/common/arg_matrix.h) for the distributed section: communicators,
// collectives, the data-parallel helper and ZeRO (a.zero3: stage 3 over a tiny model). Live handles are world-size-1 communicators (NCCL must
// be present where the GPU matrix runs).
#include "arg_matrix.h"

namespace {
using namespace argm;

const flame_comm_options_t* comm_opts(Args& a) {  // may be NULL by contract: never NULLed
  auto* o = a.opt_out<flame_comm_options_t>("opts");
  if (o) flame_comm_options_init(o);
  return o;
}
const flame_dp_options_t* dp_opts(Args& a) {
  auto* o = a.opt_out<flame_dp_options_t>("opts");
  if (o) flame_dp_options_init(o);
  return o;
}

// The launch variables of a one-rank job on device 0 (no peer, no network): set before the rows of
// the two functions that read them, whose valid call must succeed.
template <class T>
T launched_alone(T arg) {
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  return arg;
}

FLAME_ARG_ROW(flame_comm_options_init, a.out<flame_comm_options_t>("opts"));
FLAME_ARG_ROW(flame_comm_unique_id, a.ctx("ctx"), a.out<flame_comm_id_t>("id"));
// world_size 1: returns at once, no network peer needed.
FLAME_ARG_ROW(flame_comm_rendezvous, a.str("master_addr", "127.0.0.1"), 29500, 0, 1, 5.0, a.out<flame_comm_id_t>("id"));
FLAME_ARG_ROW(flame_comm_create, a.ctx("ctx"), a.comm_id("id"), 0, 1, comm_opts(a), a.out_comm("out"));
FLAME_ARG_ROW(flame_comm_env_local_rank, launched_alone(a.out<int32_t>("local_rank")));
FLAME_ARG_ROW(flame_comm_create_from_env, launched_alone(a.ctx("ctx")), comm_opts(a), a.out_comm("out"));
FLAME_ARG_ROW(flame_comm_create_group, a.ctx_array("ctxs"), 1, comm_opts(a), a.out_comm("comms"));
FLAME_ARG_VOID(flame_comm_release, a.release_comm("comm"));
FLAME_ARG_ROW(flame_comm_rank, a.comm("comm"), a.out<int32_t>("rank"));
FLAME_ARG_ROW(flame_comm_size, a.comm("comm"), a.out<int32_t>("size"));
FLAME_ARG_ROW(flame_comm_synchronize, a.comm("comm"));
FLAME_ARG_ROW(flame_comm_all_reduce, a.comm("comm"), a.t("t"), FLAME_REDUCE_SUM);
FLAME_ARG_ROW(flame_comm_broadcast, a.comm("comm"), a.t("t"), 0);
FLAME_ARG_ROW(flame_comm_all_gather, a.comm("comm"), a.t("in"), a.out_t("out"));
FLAME_ARG_ROW(flame_comm_reduce_scatter, a.comm("comm"), a.t("in"), FLAME_REDUCE_AVG, a.out_t("out"));

FLAME_ARG_ROW(flame_dp_options_init, a.out<flame_dp_options_t>("opts"));
FLAME_ARG_ROW(flame_dp_create, a.comm("comm"), a.ts("params", {param()}), 1, dp_opts(a), a.out_dp("out"));
FLAME_ARG_ROW(flame_dp_set_sync, a.dp("dp"), 0);
FLAME_ARG_ROW(flame_dp_wait, a.dp("dp"));
FLAME_ARG_VOID(flame_dp_release, a.release_dp("dp"));

// May be NULL by contract: never NULLed. Live: gradients averaged in bf16 (a valid value other than
// the default, so that the live sweep creates a helper with a communication dtype of its own).
const flame_zero_options_t* zero_opts(Args& a) {
  auto* o = a.opt_out<flame_zero_options_t>("opts");
  if (o) {
    flame_zero_options_init(o);
    o->reduce_dtype = FLAME_DTYPE_BF16;
  }
  return o;
}

// A gathered ZeRO checkpoint (world 1) of live_optimizer's one f32 [2, 3] SGD parameter, all zeros,
// named as a.out_path's file (Live; elsewhere the path is never opened).
const char* zero_ckpt_path(Args& a, const char* name) {
  const char* p = a.out_path(name);
  if (!p || a.mode() != Mode::Live) return p;
  const std::string meta =
      "{\\\"version\\\":1,\\\"world\\\":1,\\\"rank\\\":0,\\\"kind\\\":\\\"sgd\\\",\\\"step\\\":0,"
      "\\\"rounding_rng\\\":null,\\\"lr\\\":[0.001],\\\"files\\\":[\\\"out.safetensors\\\"],"
      "\\\"params\\\":[{\\\"shape\\\":[2,3],\\\"dtype\\\":\\\"f32\\\",\\\"lo\\\":0,\\\"hi\\\":6}]}";
  const std::string json = "{\"__metadata__\":{\"flame.zero_shard\":\"" + meta +
                           "\"},\"param.0\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>(static_cast<uint64_t>(json.size()) >> (8 * i)));
  bytes += json;
  bytes.append(24, '\0');
  if (FILE* f = std::fopen(p, "wb")) {
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
  return p;
}

FLAME_ARG_ROW(flame_zero_options_init, a.out<flame_zero_options_t>("opts"));
FLAME_ARG_ROW(flame_zero_create, a.comm("comm"), a.opt("opt"), zero_opts(a), a.out_zero("out"));
FLAME_ARG_ROW(flame_zero_step, a.zero("zero"), a.opt_out_t("total_norm"));
FLAME_ARG_VOID(flame_zero_release, a.release_zero("zero"));
FLAME_ARG_ROW(flame_zero_gather_params, a.zero3("zero"), a.out_params("params"));
FLAME_ARG_ROW(flame_optimizer_state_bytes, a.opt("opt"), a.out<uint64_t>("bytes"));
FLAME_ARG_ROW(flame_zero_save_full, a.zero("zero"), a.out_path("path"));
FLAME_ARG_ROW(flame_zero_save_shards, a.zero("zero"), a.out_path("path_prefix"));
FLAME_ARG_ROW(flame_zero_load, a.zero("zero"), zero_ckpt_path(a, "path"));

}  // namespace
