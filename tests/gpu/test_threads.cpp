// Threads on the GPU (issue 12), under the contract at the top of flame.h: distinct contexts run in
// parallel; one context may be used from several threads (its calls are serialised by its lock);
// error messages are per thread.
//
//  - IndependentContextsTrainInParallel: N threads, each with its own context on the same GPU (and,
//    with several GPUs, spread over them), run the same small training step (2-layer MLP, MSE,
//    backward, AdamW) on their own seed; each result must equal a single-threaded run of that seed
//    made first. gemm_heuristic_only = 1 so that every run uses the same cuBLASLt algorithm.
//  - SharedContextMixedWork: N threads share one context: each creates tensors, runs ops and a
//    backward on its own graph (checked against the host), hands a tensor to its neighbour which
//    uses and releases it, and fails a call on purpose (its message must stay its own). Afterwards
//    the context's live tensors and bytes in use are back where they started.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include "flame_test.h"

namespace {

class StartLine {  // releases all waiting threads at once
 public:
  explicit StartLine(int n) : left_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(m_);
    if (--left_ == 0) cv_.notify_all();
    cv_.wait(lock, [this] { return left_ == 0; });
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int left_;
};

#define TRY(expr)                                                                                   \
  do {                                                                                              \
    flame_status_t st_ = (expr);                                                                    \
    if (st_ != FLAME_OK) return std::string(#expr) + " -> " + flame_status_string(st_) + ": " +     \
                                flame_last_error_message();                                         \
  } while (0)

std::vector<float> host_random(std::mt19937_64& g, size_t n, float scale) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * u(g);
  return v;
}

// Three AdamW steps of a 2-layer MLP on data drawn from seed. *out: the three losses followed by
// every parameter after the last step. Returns "" or what failed.
std::string train(flame_ctx_t ctx, uint64_t seed, std::vector<float>* out) {
  const int64_t B = 32, I = 8, H = 16, O = 4;
  std::mt19937_64 g(seed);
  const int64_t sx[] = {B, I}, sy[] = {B, O}, sw1[] = {H, I}, sb1[] = {H}, sw2[] = {O, H}, sb2[] = {O};
  struct P { const int64_t* shape; int nd; size_t n; float scale; };
  const P ps[] = {{sw1, 2, size_t(H * I), 0.5f}, {sb1, 1, size_t(H), 0.1f}, {sw2, 2, size_t(O * H), 0.5f}, {sb2, 1, size_t(O), 0.1f}};
  std::vector<T> params;
  for (const P& p : ps) {
    std::vector<float> v = host_random(g, p.n, p.scale);
    T t;
    TRY(flame_from_host(ctx, v.data(), v.size() * 4, p.shape, p.nd, FLAME_DTYPE_F32, t.out()));
    TRY(flame_tensor_set_requires_grad(t, 1));
    params.push_back(std::move(t));
  }
  std::vector<float> hx = host_random(g, size_t(B * I), 1.0f), hy = host_random(g, size_t(B * O), 1.0f);
  T x, y;
  TRY(flame_from_host(ctx, hx.data(), hx.size() * 4, sx, 2, FLAME_DTYPE_F32, x.out()));
  TRY(flame_from_host(ctx, hy.data(), hy.size() * 4, sy, 2, FLAME_DTYPE_F32, y.out()));
  flame_optimizer_options_t oo;
  TRY(flame_optimizer_options_init(&oo, FLAME_OPTIMIZER_ADAMW));
  oo.lr = 1e-2;
  flame_tensor_t raw[4] = {params[0], params[1], params[2], params[3]};
  flame_optimizer_t opt = nullptr;
  TRY(flame_optimizer_create(ctx, &oo, raw, 4, &opt));
  std::string err;
  out->clear();
  for (int step = 0; step < 3 && err.empty(); ++step) {
    T h, p, loss;
    double l = 0;
    flame_status_t st = flame_linear(x, params[0], params[1], FLAME_ACTIVATION_RELU, h.out());
    if (st == FLAME_OK) st = flame_linear(h, params[2], params[3], FLAME_ACTIVATION_NONE, p.out());
    if (st == FLAME_OK) st = flame_mse_loss(p, y, FLAME_REDUCTION_MEAN, loss.out());
    if (st == FLAME_OK) st = flame_backward(ctx, loss, nullptr, 0);
    if (st == FLAME_OK) st = flame_optimizer_step(opt);
    if (st == FLAME_OK) st = flame_optimizer_zero_grad(opt, 1);
    if (st == FLAME_OK) st = flame_tensor_item(loss, &l);
    if (st != FLAME_OK) err = "step " + std::to_string(step) + ": " + flame_status_string(st) + ": " + flame_last_error_message();
    out->push_back(float(l));
  }
  flame_optimizer_release(opt);
  for (size_t k = 0; k < params.size() && err.empty(); ++k) {
    std::vector<float> v(ps[k].n);
    flame_status_t st = flame_to_host(params[k], v.data(), v.size() * 4);
    if (st != FLAME_OK) err = std::string("to_host: ") + flame_last_error_message();
    out->insert(out->end(), v.begin(), v.end());
  }
  return err;
}

flame_ctx_t make_context(int device, uint64_t seed, std::string* why) {
  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  o.device = device;
  o.seed = seed;
  o.gemm_heuristic_only = 1;  // the same GEMM algorithm in every context: results comparable
  flame_ctx_t c = nullptr;
  flame_status_t st = flame_ctx_create(&o, &c);
  if (st != FLAME_OK) *why = std::string(flame_status_string(st)) + ": " + flame_last_error_message();
  return c;
}

// "" when a and b agree to f32 rounding of a short training run.
std::string same_result(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(a[i] - b[i]) <= 1e-5f * (1.0f + std::fabs(b[i]))))
      return "value " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
  return "";
}

using Threads = GpuTest;

}  // namespace

TEST_F(Threads, IndependentContextsTrainInParallel) {
  int32_t devices = 0;
  FLAME_ASSERT_OK(flame_device_count(&devices));
  ASSERT_GE(devices, 1);
  const int kThreads = std::max(4, 2 * int(devices));
  // The single-threaded reference of each seed, in the fixture's thread on device 0.
  std::vector<std::vector<float>> want(static_cast<size_t>(kThreads));
  {
    std::string why;
    flame_ctx_t ref = make_context(0, 7, &why);
    ASSERT_NE(ref, nullptr) << why;
    for (int t = 0; t < kThreads; ++t) {
      std::string e = train(ref, 1000 + uint64_t(t), &want[size_t(t)]);
      ASSERT_EQ(e, "") << "reference run " << t;
      ASSERT_TRUE(std::isfinite(want[size_t(t)][0]) && std::isfinite(want[size_t(t)][2])) << "reference run " << t;
    }
    flame_ctx_destroy(ref);
  }
  std::vector<std::string> errors(static_cast<size_t>(kThreads));
  std::vector<std::vector<float>> got(static_cast<size_t>(kThreads));
  StartLine line(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t, devices, &line, &errors, &got] {
      std::string why;
      flame_ctx_t c = make_context(t % devices, 7, &why);  // contexts are created concurrently too
      line.arrive_and_wait();
      if (!c) { errors[size_t(t)] = "create: " + why; return; }
      for (int rep = 0; rep < 2 && errors[size_t(t)].empty(); ++rep)
        errors[size_t(t)] = train(c, 1000 + uint64_t(t), &got[size_t(t)]);
      flame_ctx_destroy(c);
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[size_t(t)], "") << "thread " << t << " (device " << t % devices << ")";
    if (errors[size_t(t)].empty()) {
      EXPECT_EQ(same_result(got[size_t(t)], want[size_t(t)]), "") << "thread " << t << " (device " << t % devices << ")";
    }
  }
}

TEST_F(Threads, SharedContextMixedWork) {
  const int kThreads = 6;
  const int64_t n = 4099;  // not a multiple of a block
  flame_memory_stats_t before{}, after{};
  before.struct_size = after.struct_size = sizeof(flame_memory_stats_t);
  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  FLAME_ASSERT_OK(flame_ctx_memory_stats(ctx, &before));

  std::vector<std::string> errors(static_cast<size_t>(kThreads));
  std::vector<flame_tensor_t> handoff(size_t(kThreads), nullptr);  // thread t's tensor, for thread t+1
  std::vector<std::vector<float>> handoff_values(static_cast<size_t>(kThreads));
  std::mutex handoff_mutex;
  StartLine first(kThreads), second(kThreads);
  std::vector<std::thread> threads;
  flame_ctx_t shared = ctx;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::string& err = errors[size_t(t)];
      std::mt19937_64 g(uint64_t(t) + 99);
      std::vector<float> hx = host_random(g, size_t(n), 2.0f), hc = host_random(g, size_t(n), 1.0f);
      first.arrive_and_wait();
      // 1. its own graph: loss = sum(c * x * x) -> d loss / dx = 2 c x, checked on the host
      err = [&]() -> std::string {
        for (int rep = 0; rep < 5; ++rep) {
          T x, c, xx, cxx, loss, grad;
          TRY(flame_from_host(shared, hx.data(), hx.size() * 4, &n, 1, FLAME_DTYPE_F32, x.out()));
          TRY(flame_from_host(shared, hc.data(), hc.size() * 4, &n, 1, FLAME_DTYPE_F32, c.out()));
          TRY(flame_tensor_set_requires_grad(x, 1));
          TRY(flame_mul(x, x, xx.out()));
          TRY(flame_mul(c, xx, cxx.out()));
          TRY(flame_sum_all(cxx, loss.out()));
          TRY(flame_backward(shared, loss, nullptr, 0));
          TRY(flame_tensor_grad(x, grad.out()));
          if (!grad.h) return "no gradient";
          std::vector<float> gv(static_cast<size_t>(n));
          TRY(flame_to_host(grad, gv.data(), gv.size() * 4));
          for (size_t i = 0; i < size_t(n); ++i) {
            const double w = 2.0 * double(hc[i]) * double(hx[i]);
            if (std::fabs(gv[i] - w) > 1e-5 * (1 + std::fabs(w)))
              return "rep " + std::to_string(rep) + ": grad[" + std::to_string(i) + "] = " + std::to_string(gv[i]) +
                     ", want " + std::to_string(w);
          }
        }
        // 2. a failure of its own: the message names this thread's call and stays until its next call
        T a, b, bad;
        const int64_t s3[] = {3}, s5[] = {5};
        TRY(flame_zeros(shared, s3, 1, FLAME_DTYPE_F32, a.out()));
        TRY(flame_zeros(shared, s5, 1, FLAME_DTYPE_F32, b.out()));
        flame_status_t st = flame_sub(a, b, bad.out());
        if (st != FLAME_ERROR_SHAPE_MISMATCH || bad.h) return std::string("sub of [3] and [5] gave ") + flame_status_string(st);
        const std::string mine = flame_last_error_message();
        if (mine.find("flame_sub") == std::string::npos) return "message of another call: " + mine;
        std::this_thread::yield();
        if (mine != flame_last_error_message()) return "message changed by another thread: " + std::string(flame_last_error_message());
        // 3. a tensor for the neighbour: x + t, which thread t+1 reads and releases
        T x, y;
        TRY(flame_from_host(shared, hx.data(), hx.size() * 4, &n, 1, FLAME_DTYPE_F32, x.out()));
        TRY(flame_add_scalar(x, double(t), y.out()));
        std::lock_guard<std::mutex> lock(handoff_mutex);
        handoff_values[size_t(t)].resize(static_cast<size_t>(n));
        for (size_t i = 0; i < size_t(n); ++i) handoff_values[size_t(t)][i] = hx[i] + float(t);
        handoff[size_t(t)] = y.h;
        y.h = nullptr;  // ownership moves to the neighbour
        return "";
      }();
      second.arrive_and_wait();
      // 4. the neighbour's tensor: use it, then release it (a handle made on another thread)
      const size_t from = size_t((t + kThreads - 1) % kThreads);
      flame_tensor_t theirs = nullptr;
      {
        std::lock_guard<std::mutex> lock(handoff_mutex);
        std::swap(theirs, handoff[from]);
      }
      if (!theirs) {
        if (err.empty()) err = "the neighbour's tensor is missing";
        return;
      }
      T owned(theirs), doubled;
      std::vector<float> v(static_cast<size_t>(n));
      flame_status_t st = flame_mul_scalar(owned, 2.0, doubled.out());
      if (st == FLAME_OK) st = flame_to_host(doubled, v.data(), v.size() * 4);
      if (st != FLAME_OK) {
        if (err.empty()) err = std::string("neighbour's tensor: ") + flame_last_error_message();
        return;
      }
      for (size_t i = 0; i < size_t(n) && err.empty(); ++i)
        if (v[i] != 2.0f * handoff_values[from][i]) err = "neighbour's tensor, value " + std::to_string(i);
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[size_t(t)], "") << "thread " << t;
  for (flame_tensor_t h : handoff) flame_tensor_release(h);  // left over only after a failure

  FLAME_ASSERT_OK(flame_ctx_synchronize(ctx));
  FLAME_ASSERT_OK(flame_ctx_memory_stats(ctx, &after));
  EXPECT_EQ(after.live_tensors, before.live_tensors);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
}
