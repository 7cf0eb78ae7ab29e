// Resizing, cropping and the tensor layout of training images (flame-train).
//
// resize_image is a separable resampler written here (no image library in Debian's base set does
// it without pulling in a toolkit): one horizontal pass, then one vertical pass, each a weighted
// sum of input pixels under a filter kernel centred on the output pixel's centre. When shrinking,
// the kernel is stretched by the scale factor so that every input pixel contributes (antialiasing,
// as PIL's Image.resize and Pillow-SIMD do); weights are normalised per output pixel, so a flat
// image stays exactly flat. Lanczos-3 (PIL's LANCZOS, kohya's choice for resizing) is the default;
// Box (area average for integer factors) and Triangle (bilinear) are there for tests and callers.
// Work is in float; nothing is rounded to 8 bits between the passes.
//
// crop_to_tensor takes a window of the resized image, optionally mirrored left-right, and writes it
// as float CHW in [-1, 1] (x / 127.5 - 1, after clamping Lanczos overshoot to [0, 255]): the VAE's
// input layout.
#pragma once

#include <vector>

#include "images.h"

namespace flame_train {

enum class ResampleFilter { Box, Triangle, Lanczos3 };

// Float RGB, HWC, values on the 0..255 scale (not clamped: Lanczos may overshoot a little).
struct ImageF32 {
  int width = 0;
  int height = 0;
  std::vector<float> pixels;  // width * height * 3
};

// in resized to out_width x out_height (both >= 1). Throws std::invalid_argument for sizes < 1.
ImageF32 resize_image(const ImageRGB8& in, int out_width, int out_height,
                      ResampleFilter filter = ResampleFilter::Lanczos3);

// Writes the crop_width x crop_height window at (left, top) of img to dst as 3 planes (R, G, B),
// each crop_height rows of crop_width floats in [-1, 1]; flip mirrors the window left-right.
// Throws std::invalid_argument when the window is not inside the image.
void crop_to_tensor(const ImageF32& img, int left, int top, int crop_width, int crop_height, bool flip,
                    float* dst);

}  // namespace flame_train
