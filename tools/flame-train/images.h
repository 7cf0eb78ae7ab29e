// Image files for flame-train: PNG, JPEG and WebP decoded to 8-bit RGB through the distribution's
// codec libraries (libpng's simplified API, libjpeg(-turbo), libwebp); nothing is decoded by hand.
// PNG is also written (the sample images).
//
// The format is told by the file's first bytes, not by its name. What comes out matches what
// kohya's trainer gets from PIL's Image.convert("RGB"): grayscale is replicated to three channels,
// palettes are expanded, 16-bit PNG is reduced to 8 bits and an alpha channel is dropped (not
// composited). CMYK JPEGs and animated WebPs are refused with a clear error. Sizes are limited to
// kMaxImageSide per side so that a corrupt or hostile header cannot ask for gigabytes.
//
// Errors are ImageError exceptions whose message names the file; the program catches them before
// any GPU work (nothing here touches FLAME).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace flame_train {

constexpr int kMaxImageSide = 16384;

class ImageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ImageFormat { Unknown, Png, Jpeg, WebP };

// Rows top to bottom, pixels left to right, R G B bytes.
struct ImageRGB8 {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // width * height * 3
};

struct ImageSize {
  int width = 0;
  int height = 0;
};

// "png", "jpeg", "webp" or "unknown".
const char* image_format_name(ImageFormat format);

// The format from the file's signature; Unknown when it is none of the three (or unreadable).
ImageFormat detect_image_format(const std::string& path);

// True for the extensions the data set scan picks up: .png .jpg .jpeg .webp (any case).
bool has_image_extension(const std::string& path);

// Width and height from the header only (no pixel decoding). Throws ImageError.
ImageSize read_image_size(const std::string& path);

// The whole image as RGB8. Throws ImageError (unreadable, unknown format, corrupt, too large).
ImageRGB8 decode_image(const std::string& path);

// Writes img as an 8-bit RGB PNG at path (libpng's simplified API). Throws ImageError naming the
// file (pixels not width * height * 3 bytes, a write error).
void write_png_rgb8(const std::string& path, const ImageRGB8& img);

}  // namespace flame_train
