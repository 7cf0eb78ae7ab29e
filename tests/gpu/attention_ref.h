// Host float64 reference of scaled-dot-product attention with PyTorch's semantics, for the GPU
// tests (test_attention.cpp, test_gradcheck.cpp): out = (softmax(scale q k^T + bias) * z) v per
// (batch, head), where bias holds the mask terms (-inf excludes a pair), the causal mask excludes
// keys j > i, rows with every key excluded give 0, and z holds the dropout factors (1 / (1 - p) or 0).
// Tensors are flat row-major [B, H, L, E] vectors of doubles.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace aref {

struct Problem {
  int64_t B = 1, H = 1, Lq = 1, Lk = 1, D = 1, Dv = 1;
  std::vector<double> q, k, v;
  std::function<double(int64_t b, int64_t h, int64_t i, int64_t j)> bias;  // additive term; may be empty
  bool causal = false;
  double scale = 0;       // 0: 1 / sqrt(D)
  std::vector<double> z;  // dropout factors [B, H, Lq, Lk]; empty: no dropout
  double used_scale() const { return scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(D)); }
};

struct Forward {
  std::vector<double> p;    // [B, H, Lq, Lk] softmax probabilities (before dropout)
  std::vector<double> out;  // [B, H, Lq, Dv]
};

inline Forward forward(const Problem& pr) {
  const double ninf = -std::numeric_limits<double>::infinity(), scale = pr.used_scale();
  Forward f;
  f.p.assign(static_cast<size_t>(pr.B * pr.H * pr.Lq * pr.Lk), 0.0);
  f.out.assign(static_cast<size_t>(pr.B * pr.H * pr.Lq * pr.Dv), 0.0);
  std::vector<double> s(static_cast<size_t>(pr.Lk));
  for (int64_t b = 0; b < pr.B; ++b)
    for (int64_t h = 0; h < pr.H; ++h) {
      const int64_t bh = b * pr.H + h;
      for (int64_t i = 0; i < pr.Lq; ++i) {
        double m = ninf;
        for (int64_t j = 0; j < pr.Lk; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < pr.D; ++e) acc += pr.q[static_cast<size_t>((bh * pr.Lq + i) * pr.D + e)] * pr.k[static_cast<size_t>((bh * pr.Lk + j) * pr.D + e)];
          double x = acc * scale;
          if (pr.bias) x += pr.bias(b, h, i, j);
          if (pr.causal && j > i) x = ninf;
          s[static_cast<size_t>(j)] = x;
          m = std::max(m, x);
        }
        double l = 0;
        for (int64_t j = 0; j < pr.Lk; ++j) {
          double e = m == ninf ? 0.0 : std::exp(s[static_cast<size_t>(j)] - m);
          s[static_cast<size_t>(j)] = e;
          l += e;
        }
        for (int64_t j = 0; j < pr.Lk; ++j) {
          const size_t idx = static_cast<size_t>((bh * pr.Lq + i) * pr.Lk + j);
          f.p[idx] = l > 0 ? s[static_cast<size_t>(j)] / l : 0.0;
        }
        for (int64_t e = 0; e < pr.Dv; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < pr.Lk; ++j) {
            const size_t idx = static_cast<size_t>((bh * pr.Lq + i) * pr.Lk + j);
            acc += f.p[idx] * (pr.z.empty() ? 1.0 : pr.z[idx]) * pr.v[static_cast<size_t>((bh * pr.Lk + j) * pr.Dv + e)];
          }
          f.out[static_cast<size_t>((bh * pr.Lq + i) * pr.Dv + e)] = acc;
        }
      }
    }
  return f;
}

struct Grads {
  std::vector<double> dq, dk, dv;
  std::vector<double> ds;  // [B, H, Lq, Lk]: the gradient of the scaled scores (= of an additive mask)
};

// Gradients of sum(out * dout).
inline Grads backward(const Problem& pr, const Forward& f, const std::vector<double>& dout) {
  const double scale = pr.used_scale();
  Grads g;
  g.dq.assign(pr.q.size(), 0.0);
  g.dk.assign(pr.k.size(), 0.0);
  g.dv.assign(pr.v.size(), 0.0);
  g.ds.assign(f.p.size(), 0.0);
  std::vector<double> dp(static_cast<size_t>(pr.Lk));
  for (int64_t bh = 0; bh < pr.B * pr.H; ++bh)
    for (int64_t i = 0; i < pr.Lq; ++i) {
      double delta = 0;
      for (int64_t j = 0; j < pr.Lk; ++j) {
        const size_t idx = static_cast<size_t>((bh * pr.Lq + i) * pr.Lk + j);
        double acc = 0;
        for (int64_t e = 0; e < pr.Dv; ++e) acc += dout[static_cast<size_t>((bh * pr.Lq + i) * pr.Dv + e)] * pr.v[static_cast<size_t>((bh * pr.Lk + j) * pr.Dv + e)];
        dp[static_cast<size_t>(j)] = acc * (pr.z.empty() ? 1.0 : pr.z[idx]);
        delta += dp[static_cast<size_t>(j)] * f.p[idx];
      }
      for (int64_t j = 0; j < pr.Lk; ++j) {
        const size_t idx = static_cast<size_t>((bh * pr.Lq + i) * pr.Lk + j);
        const double ds = f.p[idx] * (dp[static_cast<size_t>(j)] - delta);
        g.ds[idx] = ds;
        for (int64_t e = 0; e < pr.D; ++e) {
          g.dq[static_cast<size_t>((bh * pr.Lq + i) * pr.D + e)] += scale * ds * pr.k[static_cast<size_t>((bh * pr.Lk + j) * pr.D + e)];
          g.dk[static_cast<size_t>((bh * pr.Lk + j) * pr.D + e)] += scale * ds * pr.q[static_cast<size_t>((bh * pr.Lq + i) * pr.D + e)];
        }
        const double pz = f.p[idx] * (pr.z.empty() ? 1.0 : pr.z[idx]);
        for (int64_t e = 0; e < pr.Dv; ++e)
          g.dv[static_cast<size_t>((bh * pr.Lk + j) * pr.Dv + e)] += pz * dout[static_cast<size_t>((bh * pr.Lq + i) * pr.Dv + e)];
      }
    }
  return g;
}

}  // namespace aref
