// Separable resampling with antialiasing, crop, flip and the [-1, 1] CHW layout (see resample.h).
#include "resample.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace flame_train {
namespace {

constexpr double kPi = 3.14159265358979323846;

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= kPi;
  return std::sin(x) / x;
}

double filter_support(ResampleFilter f) {
  switch (f) {
    case ResampleFilter::Box: return 0.5;
    case ResampleFilter::Triangle: return 1.0;
    case ResampleFilter::Lanczos3: return 3.0;
  }
  return 1.0;
}

double filter_value(ResampleFilter f, double x) {
  switch (f) {
    case ResampleFilter::Box: return (x >= -0.5 && x < 0.5) ? 1.0 : 0.0;
    case ResampleFilter::Triangle: x = std::fabs(x); return x < 1.0 ? 1.0 - x : 0.0;
    case ResampleFilter::Lanczos3: return (x > -3.0 && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0;
  }
  return 0.0;
}

// For each output index: the first input index and the normalised weights of its taps.
struct Taps {
  std::vector<int> first;
  std::vector<int> count;
  std::vector<float> weights;  // out_size * max_taps
  int max_taps = 0;
};

Taps compute_taps(int in_size, int out_size, ResampleFilter f) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double stretch = std::max(scale, 1.0);  // widen the kernel when shrinking
  const double support = filter_support(f) * stretch;
  Taps taps;
  taps.max_taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  taps.first.resize(out_size);
  taps.count.resize(out_size);
  taps.weights.assign(static_cast<size_t>(out_size) * taps.max_taps, 0.0f);
  std::vector<double> w(taps.max_taps);
  for (int o = 0; o < out_size; ++o) {
    const double center = (o + 0.5) * scale;
    int lo = std::max(0, static_cast<int>(std::floor(center - support)));
    int hi = std::min(in_size, static_cast<int>(std::ceil(center + support)));
    if (hi - lo > taps.max_taps) hi = lo + taps.max_taps;
    double sum = 0.0;
    for (int i = lo; i < hi; ++i) {
      w[i - lo] = filter_value(f, (i + 0.5 - center) / stretch);
      sum += w[i - lo];
    }
    if (sum == 0.0) {  // cannot happen for these kernels, but never divide by zero: nearest pixel
      lo = std::min(in_size - 1, std::max(0, static_cast<int>(center)));
      hi = lo + 1;
      w[0] = sum = 1.0;
    }
    taps.first[o] = lo;
    taps.count[o] = hi - lo;
    for (int i = 0; i < hi - lo; ++i) taps.weights[static_cast<size_t>(o) * taps.max_taps + i] = static_cast<float>(w[i] / sum);
  }
  return taps;
}

}  // namespace

ImageF32 resize_image(const ImageRGB8& in, int out_width, int out_height, ResampleFilter filter) {
  if (in.width < 1 || in.height < 1 || out_width < 1 || out_height < 1 ||
      in.pixels.size() != static_cast<size_t>(in.width) * in.height * 3)
    throw std::invalid_argument("resize_image: sizes must be at least 1x1 (input " + std::to_string(in.width) + "x" +
                                std::to_string(in.height) + ", output " + std::to_string(out_width) + "x" +
                                std::to_string(out_height) + ")");
  // Horizontal pass: in.height rows of out_width pixels.
  const Taps hx = compute_taps(in.width, out_width, filter);
  std::vector<float> tmp(static_cast<size_t>(in.height) * out_width * 3);
  for (int y = 0; y < in.height; ++y) {
    const uint8_t* row = &in.pixels[static_cast<size_t>(y) * in.width * 3];
    float* out_row = &tmp[static_cast<size_t>(y) * out_width * 3];
    for (int x = 0; x < out_width; ++x) {
      const float* w = &hx.weights[static_cast<size_t>(x) * hx.max_taps];
      float r = 0, g = 0, b = 0;
      for (int k = 0; k < hx.count[x]; ++k) {
        const uint8_t* p = row + static_cast<size_t>(hx.first[x] + k) * 3;
        r += w[k] * p[0];
        g += w[k] * p[1];
        b += w[k] * p[2];
      }
      out_row[x * 3 + 0] = r;
      out_row[x * 3 + 1] = g;
      out_row[x * 3 + 2] = b;
    }
  }
  // Vertical pass.
  const Taps vy = compute_taps(in.height, out_height, filter);
  ImageF32 out;
  out.width = out_width;
  out.height = out_height;
  out.pixels.assign(static_cast<size_t>(out_width) * out_height * 3, 0.0f);
  const size_t row_floats = static_cast<size_t>(out_width) * 3;
  for (int y = 0; y < out_height; ++y) {
    float* out_row = &out.pixels[y * row_floats];
    const float* w = &vy.weights[static_cast<size_t>(y) * vy.max_taps];
    for (int k = 0; k < vy.count[y]; ++k) {
      const float* src = &tmp[static_cast<size_t>(vy.first[y] + k) * row_floats];
      for (size_t i = 0; i < row_floats; ++i) out_row[i] += w[k] * src[i];
    }
  }
  return out;
}

void crop_to_tensor(const ImageF32& img, int left, int top, int crop_width, int crop_height, bool flip, float* dst) {
  if (crop_width < 1 || crop_height < 1 || left < 0 || top < 0 || left + crop_width > img.width ||
      top + crop_height > img.height)
    throw std::invalid_argument("crop_to_tensor: window " + std::to_string(crop_width) + "x" +
                                std::to_string(crop_height) + " at (" + std::to_string(left) + ", " +
                                std::to_string(top) + ") is not inside the " + std::to_string(img.width) + "x" +
                                std::to_string(img.height) + " image");
  const size_t plane = static_cast<size_t>(crop_width) * crop_height;
  for (int y = 0; y < crop_height; ++y) {
    const float* row = &img.pixels[(static_cast<size_t>(top + y) * img.width + left) * 3];
    for (int x = 0; x < crop_width; ++x) {
      const int sx = flip ? crop_width - 1 - x : x;
      for (int c = 0; c < 3; ++c) {
        float v = std::min(255.0f, std::max(0.0f, row[sx * 3 + c]));
        dst[c * plane + static_cast<size_t>(y) * crop_width + x] = v / 127.5f - 1.0f;
      }
    }
  }
}

}  // namespace flame_train
