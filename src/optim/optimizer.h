// Optimizers over parameter groups (SGD, Adam, AdamW, Lion), each step one fused multi-tensor
// kernel launch per group and parameter dtype (cuda/optim.cuh). State lives in the optimizer:
// moments in the compute type (f32 for f16/bf16/f32 parameters) and, on request, f32 master
// weights for f16/bf16 parameters. Parameters are updated in place (their version counters move,
// as after any in-place write). Stochastic rounding draws from the optimizer's own Philox stream
// (keyed once from the context's generator at the first rounding step), so that the optimizer's
// state, saved and loaded by optim_state.cpp, replays a run bit for bit whatever else uses the
// context's generator.
//
// 8-bit states (set_state_bits(8), bitsandbytes' Adam8bit / AdamW8bit / Lion8bit): the moments of
// every f16/bf16/f32 parameter of at least kMinQuantizedNumel elements are u8 codes with one f32
// absmax per block of 256 elements (m_absmax, v_absmax); smaller parameters (biases, norms) keep f32
// moments, as bitsandbytes' min_8bit_size. The two code tables (blockwise8_codes) are uploaded once
// per optimizer. A parameter's moments are 8-bit exactly when its m is u8.
//
// Graph capture (runtime/capture.h): the step count and each group's learning rate live in a small
// device record, [int64 step, f64 lr of group 0, 1, ...]. Every step launches optim_tick (step += 1
// on the device) and the update kernels read the step (bias corrections, SGD's first step) and the
// rate from it, eagerly as in a captured graph, so that replaying a captured step N times equals N
// eager steps bit for bit and set_lr between replays takes effect. The host keeps its own copies for
// get_lr, step_count and the state file; a replay adds to the host count. State created during a
// capture is set-up memory, zeroed once at capture time rather than inside the graph.
#pragma once
#include <memory>
#include <string>
#include <vector>
#include "flame.h"
#include "tensor/tensor.h"

namespace flame {

// Sharded optimizers (ZeRO, toolkit/zero.h): a rank steps only the elements [shard_lo, shard_hi) of
// each parameter (flat, row-major), reading their gradient from shard_grad (1-D, shard_hi - shard_lo
// elements, set before every step); the state tensors then hold only those elements (1-D). Stochastic
// rounding draws element i of a parameter from the same Philox counter as the unsharded step.
// With parameter sharding (ZeRO-3) the owned elements live in shard_value instead of in param
// (whose tensor then holds no memory): the step reads and writes them there.
struct OptimParam {
  Tensor param;
  Tensor m, v, vmax, master;  // created at the first step that sees a gradient
  Tensor m_absmax, v_absmax;   // 8-bit moments: f32 [ceil(numel / 256)] each (m, v are u8 then)
  int64_t first_step = 0;      // the step that created m (SGD's buffer starts as that step's gradient)
  int64_t shard_lo = 0, shard_hi = 0;  // sharded optimizers only: the elements this rank steps
  Tensor shard_grad;                   // sharded optimizers only: their gradient
  Tensor shard_value;                  // sharded optimizers only, when set: those elements (1-D, contiguous)
};

struct OptimGroup {
  flame_optimizer_options_t opts;
  std::vector<OptimParam> params;
};

// 8-bit states: the parameters with fewer elements keep f32 moments (bitsandbytes' min_8bit_size).
constexpr int64_t kMinQuantizedNumel = 4096;
constexpr int64_t kQuantBlock = 256;  // elements per absmax (cuda/optim.cuh)

// The code tables of 8-bit moments, ascending (flame.h, flame_optimizer_set_state_bits, gives the
// rule): signed (first moments) when is_signed, else unsigned (second moments). 256 values each.
std::vector<float> blockwise8_codes(bool is_signed);

// The stochastic-rounding generator: Philox key and next counter; ready once keyed.
struct RoundingRng {
  bool ready = false;
  uint64_t seed = 0, offset = 0;
};

class Optimizer : public std::enable_shared_from_this<Optimizer> {
 public:
  Optimizer(Context& ctx, int32_t kind) : ctx_(ctx.shared_from_this()), kind_(kind) {}
  // Validates opts (same kind as the optimizer, finite non-negative values) and params (floating,
  // contiguous leaves of this context, no duplicates in the optimizer).
  void add_group(const flame_optimizer_options_t& opts, const std::vector<Tensor>& params);
  // Steps every parameter with a .grad; FLAME_ERROR_INVALID_ARGUMENT on a sharded optimizer.
  void step();
  // From now on the optimizer is sharded (see OptimParam): only step_shard steps it, no group can
  // be added, and its state cannot be saved or loaded. Needs an optimizer that never stepped.
  void make_sharded();
  // Throws (FLAME_ERROR_INVALID_ARGUMENT) unless make_sharded may be called.
  void check_shardable() const;
  bool sharded() const { return sharded_; }
  // Steps the owned elements of every parameter from their shard_grad (sharded optimizers).
  void step_shard();
  // Bytes of device memory held by the state tensors (moments, their absmax, master weights).
  uint64_t state_bytes() const;
  // 32 (f32 moments, the default) or 8 (see above). Needs an Adam, AdamW or Lion optimizer that has
  // no state yet, no amsgrad group, and is not sharded; FLAME_ERROR_INVALID_ARGUMENT otherwise.
  void set_state_bits(int32_t bits);
  int32_t state_bits() const { return state_bits_; }
  // Whether parameter p gets 8-bit moments under the current setting.
  bool quantizes(const Tensor& param) const;
  void zero_grad(bool set_to_none);
  // Sets the host value and, in stream order, the device record's (a memset, capturable).
  void set_lr(int32_t group, double lr);
  std::vector<OptimGroup>& groups() { return groups_; }
  int64_t step_count() const { return steps_; }
  int32_t kind() const { return kind_; }
  Context& ctx() { return *ctx_; }
  // Saved and restored with the rest of the state (optim_state.cpp).
  RoundingRng& rounding_rng() { return rng_; }
  void set_step_count(int64_t steps) {
    steps_ = steps;
    record_stale_ = true;  // with the learning rates load_state set
  }

 private:
  std::shared_ptr<Context> ctx_;
  int32_t kind_;
  int64_t steps_ = 0;
  RoundingRng rng_;
  std::vector<OptimGroup> groups_;
  Tensor record_;              // [int64 step, f64 lr per group] on the device
  bool record_stale_ = true;   // host step count or groups changed: upload before the next step
  bool sharded_ = false;
  int32_t state_bits_ = 32;
  Tensor codes_;  // 8-bit states: f32 [2 * 256], blockwise8_codes(true) then (false); set-up memory
  void run_step();
  void upload_codes();
  uint64_t take_rounding_rng(uint64_t n);
  void sync_record();
};

void validate_optimizer_options(const flame_optimizer_options_t& o, int32_t kind);

// The optimizer's state as a safetensors file (optim_state.cpp): see flame_optimizer_save_state.
void save_optimizer_state(Optimizer& opt, const std::string& path);
void load_optimizer_state(Optimizer& opt, const std::string& path);

// A kind's name in state files ("sgd", "adam", "adamw", "lion"; "unknown" otherwise).
const char* optimizer_kind_name(int32_t kind);
// The kind named so in state files; -1 for another name.
int32_t optimizer_kind_of_name(const std::string& name);
// The state slot names of a kind, in OptimParam order m, v, vmax (torch.optim's state keys; Adam's
// for a kind of another value).
std::vector<std::string> optimizer_state_slot_names(int32_t kind);
// Whether the slots a state file holds for one parameter (present[k] for slot k of
// optimizer_state_slot_names; entries past n_slots are ignored) form a state the optimizer can step:
// Adam's exp_avg and exp_avg_sq come together, and max_exp_avg_sq only with them (a lone exp_avg
// would meet a zero exp_avg_sq and take a first step about 30 times too large). A one-slot kind
// holds its slot or none.
bool optimizer_state_slots_complete(const std::vector<bool>& present, size_t n_slots);

}  // namespace flame
