// Test images written with the codec libraries' own encoders (libpng's simplified API, libjpeg,
// libwebp), so that no binary file is committed (TempDir and write_text: trainer_test_support.h).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <jpeglib.h>
#include <png.h>
#include <webp/encode.h>

#include "images.h"
#include "trainer_test_support.h"

namespace flame_train_test {

// A deterministic RGB pattern: smooth ramps with a diagonal term, so that rows and columns differ.
inline flame_train::ImageRGB8 pattern_image(int width, int height) {
  flame_train::ImageRGB8 img;
  img.width = width;
  img.height = height;
  img.pixels.resize(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &img.pixels[(static_cast<size_t>(y) * width + x) * 3];
      p[0] = static_cast<uint8_t>(x * 255 / (width > 1 ? width - 1 : 1));
      p[1] = static_cast<uint8_t>(y * 255 / (height > 1 ? height - 1 : 1));
      p[2] = static_cast<uint8_t>((x + 2 * y) % 256);
    }
  return img;
}

// format: PNG_FORMAT_RGB, PNG_FORMAT_RGBA, PNG_FORMAT_GRAY, ...; pixels in that format.
inline void write_png(const std::string& path, int width, int height, png_uint_32 format,
                      const std::vector<uint8_t>& pixels) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = format;
  if (!png_image_write_to_file(&image, path.c_str(), 0, pixels.data(), 0, nullptr))
    throw std::runtime_error("png_image_write_to_file: " + std::string(image.message));
}

inline void write_png(const std::string& path, const flame_train::ImageRGB8& img) {
  write_png(path, img.width, img.height, PNG_FORMAT_RGB, img.pixels);
}

// components 3 (RGB) or 1 (grayscale).
inline void write_jpeg(const std::string& path, int width, int height, int components, const std::vector<uint8_t>& pixels,
                       int quality = 95) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path);
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);  // test images are always valid: libjpeg's default exit is fine
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, f);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = components;
  cinfo.in_color_space = components == 3 ? JCS_RGB : JCS_GRAYSCALE;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  const size_t stride = static_cast<size_t>(width) * components;
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(&pixels[cinfo.next_scanline * stride]);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::fclose(f);
}

inline void write_jpeg(const std::string& path, const flame_train::ImageRGB8& img, int quality = 95) {
  write_jpeg(path, img.width, img.height, 3, img.pixels, quality);
}

// Lossless WebP (exact pixels back).
inline void write_webp(const std::string& path, const flame_train::ImageRGB8& img) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  uint8_t* out = nullptr;
  size_t size = WebPEncodeLosslessRGB(img.pixels.data(), img.width, img.height, img.width * 3, &out);
  if (size == 0) throw std::runtime_error("WebPEncodeLosslessRGB failed");
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(out), static_cast<std::streamsize>(size));
  WebPFree(out);
  if (!f) throw std::runtime_error("cannot write " + path);
}

}  // namespace flame_train_test
