// Optimizer state files (flame_optimizer_save_state / flame_optimizer_load_state): an optimizer
// trained k steps, saved, and trained n more steps ends with the same parameters, bit for bit, as a
// fresh optimizer over copies of the step-k parameters that loads the file and runs the same n
// steps: SGD with momentum, Adam with amsgrad (f64), AdamW over two groups, Lion, and bf16
// parameters with f32 master weights and stochastic rounding (the rounding generator is part of the
// state; the context's generator is disturbed in between to prove it). Then every rejected file
// leaves the optimizer exactly as it was.
#include <cstdio>
#include <string>
#include <vector>
#include "host_ref.h"
#include "temp_files_test.h"

using namespace href;

namespace {

class OptimState : public TempFilesTest {};

struct Config {
  const char* name;
  int32_t kind;
  flame_dtype_t dtype;
  void (*edit)(flame_optimizer_options_t&, int group);
  int groups;
};

const Config kConfigs[] = {
    {"sgd_momentum", FLAME_OPTIMIZER_SGD, FLAME_DTYPE_F32,
     [](flame_optimizer_options_t& o, int) { o.lr = 0.05; o.momentum = 0.9; o.weight_decay = 0.01; }, 1},
    {"adam_amsgrad_f64", FLAME_OPTIMIZER_ADAM, FLAME_DTYPE_F64,
     [](flame_optimizer_options_t& o, int) { o.lr = 0.01; o.amsgrad = 1; }, 1},
    {"adamw_two_groups", FLAME_OPTIMIZER_ADAMW, FLAME_DTYPE_F32,
     [](flame_optimizer_options_t& o, int g) { o.lr = g ? 0.003 : 0.01; o.weight_decay = g ? 0.0 : 0.1; }, 2},
    {"lion", FLAME_OPTIMIZER_LION, FLAME_DTYPE_F32, [](flame_optimizer_options_t& o, int) { o.lr = 0.003; }, 1},
    {"adamw_bf16_master_stochastic", FLAME_OPTIMIZER_ADAMW, FLAME_DTYPE_BF16,
     [](flame_optimizer_options_t& o, int) { o.lr = 1e-3; o.master_weights = 1; o.stochastic_rounding = 1; }, 1},
};

// Parameters (leaves with requires_grad) uploaded from host values, split into groups.
struct Model {
  std::vector<T> params;
  std::vector<flame_tensor_t> raw;
};
Model make_model(flame_ctx_t ctx, const std::vector<HT>& values) {
  Model m;
  for (const HT& v : values) {
    m.params.push_back(upload(ctx, v));
    EXPECT_EQ(flame_tensor_set_requires_grad(m.params.back(), 1), FLAME_OK);
    m.raw.push_back(m.params.back());
  }
  return m;
}
// Group g holds parameters [g * per, (g + 1) * per).
flame_optimizer_t make_opt(flame_ctx_t ctx, const Config& s, Model& m, double lr_scale = 1.0) {
  const int per = static_cast<int>(m.raw.size()) / s.groups;
  flame_optimizer_t opt = nullptr;
  for (int g = 0; g < s.groups; ++g) {
    flame_optimizer_options_t o;
    EXPECT_EQ(flame_optimizer_options_init(&o, s.kind), FLAME_OK);
    s.edit(o, g);
    o.lr *= lr_scale;
    if (g == 0) EXPECT_EQ(flame_optimizer_create(ctx, &o, m.raw.data(), per, &opt), FLAME_OK) << flame_last_error_message();
    else EXPECT_EQ(flame_optimizer_add_param_group(opt, &o, m.raw.data() + g * per, per, nullptr), FLAME_OK);
  }
  return opt;
}
void run_steps(flame_ctx_t ctx, flame_optimizer_t opt, Model& m, const std::vector<std::vector<HT>>& grads) {
  for (const auto& step : grads) {
    for (size_t k = 0; k < m.params.size(); ++k) {
      T g = upload(ctx, step[k]);
      ASSERT_EQ(flame_tensor_set_grad(m.params[k], g), FLAME_OK) << flame_last_error_message();
    }
    ASSERT_EQ(flame_optimizer_step(opt), FLAME_OK) << flame_last_error_message();
  }
}
// Draws from the context's generator, so that nothing may depend on its position.
void disturb_rng(flame_ctx_t ctx) {
  const int64_t shape[] = {1000};
  T r;
  ASSERT_EQ(flame_rand(ctx, shape, 1, FLAME_DTYPE_F32, r.out()), FLAME_OK);
}

::testing::AssertionResult identical(flame_tensor_t a, flame_tensor_t b) {
  const std::vector<double> x = download(a).values(), y = download(b).values();
  if (x.size() != y.size()) return ::testing::AssertionFailure() << "sizes differ";
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (std::memcmp(&x[i], &y[i], sizeof(double)) != 0 && !bad++) first = i;
  if (!bad) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << x.size() << " values differ; first [" << first << "] "
                                       << x[first] << " vs " << y[first];
}

TEST_F(OptimState, ResumeIsBitExact) {
  HREF_RNG(rng);
  const Shape shapes[] = {{33, 7}, {70000}, {5}, {16, 16}};  // 70000 spans two kernel chunks
  for (const Config& s : kConfigs) {
    SCOPED_TRACE(s.name);
    std::vector<HT> init;
    for (const Shape& sh : shapes) init.push_back(random(rng, sh, s.dtype, -1, 1));
    auto grads = [&](int n) {
      std::vector<std::vector<HT>> v(static_cast<size_t>(n));
      for (auto& step : v)
        for (const Shape& sh : shapes) step.push_back(random(rng, sh, s.dtype, -1, 1));
      return v;
    };
    const auto first = grads(3), rest = grads(4);

    Model a = make_model(ctx, init);
    flame_optimizer_t oa = make_opt(ctx, s, a);
    ASSERT_NE(oa, nullptr);
    run_steps(ctx, oa, a, first);
    const std::string file = path((std::string(s.name) + ".safetensors").c_str());
    FLAME_ASSERT_OK(flame_optimizer_save_state(oa, file.c_str()));
    std::vector<HT> at_k;
    for (const T& p : a.params) at_k.push_back(download(p));
    disturb_rng(ctx);
    run_steps(ctx, oa, a, rest);

    // A fresh optimizer (other learning rates, which the file overrides) over copies of the
    // step-k parameters, after more draws from the context's generator.
    disturb_rng(ctx);
    Model b = make_model(ctx, at_k);
    flame_optimizer_t ob = make_opt(ctx, s, b, 7.0);
    ASSERT_NE(ob, nullptr);
    FLAME_ASSERT_OK(flame_optimizer_load_state(ob, file.c_str()));
    int64_t steps = -1;
    FLAME_ASSERT_OK(flame_optimizer_step_count(ob, &steps));
    EXPECT_EQ(steps, 3);
    for (int g = 0; g < s.groups; ++g) {
      double la = 0, lb = 0;
      FLAME_ASSERT_OK(flame_optimizer_get_lr(oa, g, &la));
      FLAME_ASSERT_OK(flame_optimizer_get_lr(ob, g, &lb));
      EXPECT_EQ(la, lb) << "group " << g;
    }
    disturb_rng(ctx);
    run_steps(ctx, ob, b, rest);
    for (size_t k = 0; k < a.params.size(); ++k) EXPECT_TRUE(identical(a.params[k], b.params[k])) << "param " << k;
    flame_optimizer_release(oa);
    flame_optimizer_release(ob);
  }
}

TEST_F(OptimState, StateTensorsAreNamedAsTorch) {
  T p = upload(ctx, HT({4}, FLAME_DTYPE_BF16, 0.5)), q = upload(ctx, HT({2, 2}, FLAME_DTYPE_BF16, 0.25));
  flame_tensor_t raw[2] = {p, q};
  for (flame_tensor_t t : raw) FLAME_ASSERT_OK(flame_tensor_set_requires_grad(t, 1));
  flame_optimizer_options_t o;
  FLAME_ASSERT_OK(flame_optimizer_options_init(&o, FLAME_OPTIMIZER_ADAMW));
  o.master_weights = 1;
  o.amsgrad = 1;
  flame_optimizer_t opt = nullptr;
  FLAME_ASSERT_OK(flame_optimizer_create(ctx, &o, raw, 2, &opt));
  T g = upload(ctx, HT({4}, FLAME_DTYPE_BF16, 1.0));
  FLAME_ASSERT_OK(flame_tensor_set_grad(p, g));  // q has no gradient: no state
  FLAME_ASSERT_OK(flame_optimizer_step(opt));
  const std::string file = path("names.safetensors");
  FLAME_ASSERT_OK(flame_optimizer_save_state(opt, file.c_str()));
  flame_safetensors_t st = nullptr;
  FLAME_ASSERT_OK(flame_safetensors_load(ctx, file.c_str(), &st));
  int64_t n = 0;
  FLAME_ASSERT_OK(flame_safetensors_count(st, &n));
  std::vector<std::string> names;
  for (int64_t i = 0; i < n; ++i) {
    const char* name = nullptr;
    FLAME_ASSERT_OK(flame_safetensors_name(st, i, &name));
    names.push_back(name);
    flame_dtype_t dt;
    int64_t shape[4];
    int32_t nd = 0;
    FLAME_ASSERT_OK(flame_safetensors_info(st, name, &dt, shape, 4, &nd));
    EXPECT_EQ(dt, FLAME_DTYPE_F32) << name;
    ASSERT_EQ(nd, 1) << name;
    EXPECT_EQ(shape[0], 4) << name;
  }
  const std::vector<std::string> want = {"master.0", "state.0.exp_avg", "state.0.exp_avg_sq", "state.0.max_exp_avg_sq"};
  EXPECT_EQ(names, want);
  const char* meta = nullptr;
  FLAME_ASSERT_OK(flame_safetensors_metadata(st, "flame.optimizer_state", &meta));
  ASSERT_NE(meta, nullptr);
  const std::string m = meta;
  EXPECT_NE(m.find("\"kind\":\"adamw\""), std::string::npos) << m;
  EXPECT_NE(m.find("\"step\":1"), std::string::npos) << m;
  // The moments after one step with g = 1: exp_avg = 0.1, exp_avg_sq = 0.001.
  T ea;
  FLAME_ASSERT_OK(flame_safetensors_get(st, "state.0.exp_avg", ea.out()));
  EXPECT_TRUE(matches(ea, HT({4}, FLAME_DTYPE_F32, round_to(0.1, FLAME_DTYPE_F32)), Tol{1e-6, 0}));
  flame_safetensors_release(st);
  flame_optimizer_release(opt);
}

TEST_F(OptimState, RejectedFilesChangeNothing) {
  HREF_RNG(rng);
  const Shape shapes[] = {{3, 5}, {7}};
  std::vector<HT> init;
  for (const Shape& sh : shapes) init.push_back(random(rng, sh, FLAME_DTYPE_F32, -1, 1));
  std::vector<std::vector<HT>> g1(2), g2(2);
  for (auto* gs : {&g1, &g2})
    for (auto& step : *gs)
      for (const Shape& sh : shapes) step.push_back(random(rng, sh, FLAME_DTYPE_F32, -1, 1));
  const Config adam = {"adam", FLAME_OPTIMIZER_ADAM, FLAME_DTYPE_F32, [](flame_optimizer_options_t& o, int) { o.lr = 0.01; }, 1};

  // a: trained 2 steps and saved; b: its twin, loaded from the file.
  Model a = make_model(ctx, init);
  flame_optimizer_t oa = make_opt(ctx, adam, a);
  run_steps(ctx, oa, a, g1);
  const std::string good = path("good.safetensors");
  FLAME_ASSERT_OK(flame_optimizer_save_state(oa, good.c_str()));
  std::vector<HT> at_k;
  for (const T& p : a.params) at_k.push_back(download(p));
  Model b = make_model(ctx, at_k);
  flame_optimizer_t ob = make_opt(ctx, adam, b);
  FLAME_ASSERT_OK(flame_optimizer_load_state(ob, good.c_str()));

  // The metadata of the good file, reused by forged files.
  flame_safetensors_t st = nullptr;
  FLAME_ASSERT_OK(flame_safetensors_load(ctx, good.c_str(), &st));
  const char* meta_c = nullptr;
  FLAME_ASSERT_OK(flame_safetensors_metadata(st, "flame.optimizer_state", &meta_c));
  ASSERT_NE(meta_c, nullptr);
  const std::string meta = meta_c;
  T m0, v0, v1;
  FLAME_ASSERT_OK(flame_safetensors_get(st, "state.0.exp_avg", m0.out()));
  FLAME_ASSERT_OK(flame_safetensors_get(st, "state.0.exp_avg_sq", v0.out()));
  FLAME_ASSERT_OK(flame_safetensors_get(st, "state.1.exp_avg_sq", v1.out()));
  flame_safetensors_release(st);
  auto forge = [&](const char* name, std::vector<std::pair<std::string, flame_tensor_t>> ts, const std::string& md) {
    const std::string f = path(name);
    std::vector<const char*> names;
    std::vector<flame_tensor_t> hs;
    for (auto& e : ts) { names.push_back(e.first.c_str()); hs.push_back(e.second); }
    const char* kv[2] = {"flame.optimizer_state", md.c_str()};
    EXPECT_EQ(flame_safetensors_save(ctx, f.c_str(), names.data(), hs.data(), static_cast<int64_t>(hs.size()), kv,
                                     md.empty() ? 0 : 1), FLAME_OK) << flame_last_error_message();
    return f;
  };
  T m0_f64, wrong_shape;
  FLAME_ASSERT_OK(flame_to_dtype(m0, FLAME_DTYPE_F64, m0_f64.out()));
  const int64_t ws[] = {15};
  FLAME_ASSERT_OK(flame_reshape(m0, ws, 1, wrong_shape.out()));
  std::string bad_meta = meta;
  bad_meta.replace(bad_meta.find("\"kind\":\"adam\""), 13, "\"kind\":\"sgd\"");
  std::string neg_lr = meta;
  neg_lr.replace(neg_lr.find("\"lr\":"), 5, "\"lr\":-");
  const std::string valid_tail[] = {"state.0.exp_avg_sq", "state.1.exp_avg_sq"};
  struct Bad {
    std::string file;
    flame_status_t status;
  };
  const Bad bads[] = {
      {forge("no_meta.safetensors", {{"state.0.exp_avg", m0}}, ""), FLAME_ERROR_INVALID_FORMAT},
      {forge("not_json.safetensors", {}, "{\"version\": 1,"), FLAME_ERROR_INVALID_FORMAT},
      {forge("unknown_name.safetensors", {{"state.0.exp_avg_sq", v0}, {"state.0.bogus", m0}}, meta), FLAME_ERROR_INVALID_FORMAT},
      {forge("index_range.safetensors", {{"state.2.exp_avg", m0}}, meta), FLAME_ERROR_INVALID_FORMAT},
      {forge("wrong_dtype.safetensors", {{"state.0.exp_avg", m0_f64}, {valid_tail[0], v0}}, meta), FLAME_ERROR_INVALID_FORMAT},
      {forge("wrong_shape.safetensors", {{"state.0.exp_avg", wrong_shape}, {valid_tail[0], v0}}, meta), FLAME_ERROR_INVALID_FORMAT},
      {forge("master_f32.safetensors", {{"master.0", m0}}, meta), FLAME_ERROR_INVALID_FORMAT},
      {forge("half_adam.safetensors", {{"state.1.exp_avg_sq", v1}}, meta), FLAME_ERROR_INVALID_FORMAT},
      {forge("other_kind.safetensors", {}, bad_meta), FLAME_ERROR_INVALID_ARGUMENT},
      {forge("negative_lr.safetensors", {}, neg_lr), FLAME_ERROR_INVALID_FORMAT},
      {dir + "/missing.safetensors", FLAME_ERROR_IO},
  };
  for (const Bad& bad : bads) {
    SCOPED_TRACE(bad.file);
    FLAME_EXPECT_STATUS(flame_optimizer_load_state(ob, bad.file.c_str()), bad.status);
    EXPECT_NE(std::string(flame_last_error_message()).find("flame_optimizer_load_state"), std::string::npos);
  }
  // Optimizers of another shape, dtype or group count reject the good file.
  {
    std::vector<HT> other = init;
    other[1] = random(rng, {8}, FLAME_DTYPE_F32, -1, 1);
    Model c = make_model(ctx, other);
    flame_optimizer_t oc = make_opt(ctx, adam, c);
    FLAME_EXPECT_STATUS(flame_optimizer_load_state(oc, good.c_str()), FLAME_ERROR_SHAPE_MISMATCH);
    flame_optimizer_release(oc);
    std::vector<HT> f64 = {init[0].as(FLAME_DTYPE_F64), init[1].as(FLAME_DTYPE_F64)};
    Model d = make_model(ctx, f64);
    flame_optimizer_t od = make_opt(ctx, adam, d);
    FLAME_EXPECT_STATUS(flame_optimizer_load_state(od, good.c_str()), FLAME_ERROR_DTYPE_MISMATCH);
    flame_optimizer_release(od);
    Model e = make_model(ctx, init);
    const Config two = {"adam2", FLAME_OPTIMIZER_ADAM, FLAME_DTYPE_F32, [](flame_optimizer_options_t& o, int) { o.lr = 0.01; }, 2};
    flame_optimizer_t oe = make_opt(ctx, two, e);
    FLAME_EXPECT_STATUS(flame_optimizer_load_state(oe, good.c_str()), FLAME_ERROR_INVALID_ARGUMENT);
    flame_optimizer_release(oe);
  }
  FLAME_EXPECT_STATUS(flame_optimizer_load_state(ob, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_optimizer_save_state(ob, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_optimizer_save_state(nullptr, good.c_str()), FLAME_ERROR_INVALID_ARGUMENT);
  FLAME_EXPECT_STATUS(flame_optimizer_save_state(ob, (dir + "/no/such/dir/x.safetensors").c_str()), FLAME_ERROR_IO);

  // b is still a's twin: the same two more steps give the same parameters.
  int64_t steps = 0;
  FLAME_ASSERT_OK(flame_optimizer_step_count(ob, &steps));
  EXPECT_EQ(steps, 2);
  run_steps(ctx, oa, a, g2);
  run_steps(ctx, ob, b, g2);
  for (size_t k = 0; k < a.params.size(); ++k) EXPECT_TRUE(identical(a.params[k], b.params[k])) << "param " << k;
  flame_optimizer_release(oa);
  flame_optimizer_release(ob);
}

}  // namespace
