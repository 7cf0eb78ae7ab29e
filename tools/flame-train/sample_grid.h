// The sample images' pixels on the host (flame-train): the VAE's decoded images (f32, [3, H, W]
// channel-major, values about [-1, 1]) turned into 8-bit RGB as diffusers' image processor does
// (postprocess: (x / 2 + 0.5) clamped to [0, 1], times 255, rounded), laid side by side in one row
// (one image per sample prompt), and written as a binary PPM (P6) for builds without libpng
// (FLAME_TRAINER_IMAGES OFF). Pure functions, no GPU: the CPU tests check them.
#pragma once

#include <string>
#include <vector>

#include "images.h"

namespace flame_train {

// One decoded image [3, height, width] f32 to RGB8 (non-finite values become 0). Throws
// std::invalid_argument when chw does not hold 3 * height * width values.
ImageRGB8 decoded_to_rgb8(const std::vector<float>& chw, int height, int width);

// The images left to right in one row; all must have the same height (std::invalid_argument otherwise,
// or for none).
ImageRGB8 image_row(const std::vector<ImageRGB8>& images);

// Writes img as a binary PPM (P6, maxval 255) at path. Throws std::runtime_error naming the file.
void write_ppm(const std::string& path, const ImageRGB8& img);

}  // namespace flame_train
