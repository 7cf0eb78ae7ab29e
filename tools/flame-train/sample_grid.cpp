// Host-side pixels of the sample images (see sample_grid.h).
#include "sample_grid.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>

namespace flame_train {

ImageRGB8 decoded_to_rgb8(const std::vector<float>& chw, int height, int width) {
  const size_t plane = static_cast<size_t>(height) * static_cast<size_t>(width);
  if (height <= 0 || width <= 0 || chw.size() != 3 * plane)
    throw std::invalid_argument("decoded image: " + std::to_string(chw.size()) + " values for 3 x " +
                                std::to_string(height) + " x " + std::to_string(width));
  ImageRGB8 img;
  img.width = width;
  img.height = height;
  img.pixels.resize(3 * plane);
  for (size_t p = 0; p < plane; ++p)
    for (size_t c = 0; c < 3; ++c) {
      const double x = chw[c * plane + p];
      const double unit = std::isfinite(x) ? std::fmin(1.0, std::fmax(0.0, x / 2.0 + 0.5)) : 0.0;
      img.pixels[p * 3 + c] = static_cast<uint8_t>(std::nearbyint(unit * 255.0));
    }
  return img;
}

ImageRGB8 image_row(const std::vector<ImageRGB8>& images) {
  if (images.empty()) throw std::invalid_argument("image row: no images");
  ImageRGB8 row;
  row.height = images.front().height;
  for (const ImageRGB8& img : images) {
    if (img.height != row.height)
      throw std::invalid_argument("image row: heights " + std::to_string(row.height) + " and " +
                                  std::to_string(img.height) + " differ");
    row.width += img.width;
  }
  row.pixels.resize(static_cast<size_t>(row.width) * row.height * 3);
  size_t x0 = 0;
  for (const ImageRGB8& img : images) {
    for (int y = 0; y < img.height; ++y) {
      const uint8_t* src = &img.pixels[static_cast<size_t>(y) * img.width * 3];
      uint8_t* dst = &row.pixels[(static_cast<size_t>(y) * row.width + x0) * 3];
      std::copy(src, src + static_cast<size_t>(img.width) * 3, dst);
    }
    x0 += static_cast<size_t>(img.width);
  }
  return row;
}

void write_ppm(const std::string& path, const ImageRGB8& img) {
  struct Closer {
    void operator()(FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<FILE, Closer> f(std::fopen(path.c_str(), "wb"));
  if (!f) throw std::runtime_error("cannot write " + path);
  const bool ok = std::fprintf(f.get(), "P6\n%d %d\n255\n", img.width, img.height) > 0 &&
                  std::fwrite(img.pixels.data(), 1, img.pixels.size(), f.get()) == img.pixels.size();
  if (!ok || std::fclose(f.release()) != 0) throw std::runtime_error("cannot write " + path);
}

}  // namespace flame_train
