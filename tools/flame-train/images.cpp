// PNG / JPEG / WebP decoding through libpng, libjpeg(-turbo) and libwebp (see images.h).
#include "images.h"

#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

namespace flame_train {
namespace {

struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};
using FilePtr = std::unique_ptr<FILE, FileCloser>;

FilePtr open_or_throw(const std::string& path) {
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) throw ImageError(path + ": cannot open: " + std::strerror(errno));
  return f;
}

std::vector<uint8_t> read_bytes(const std::string& path, size_t max_bytes) {
  FilePtr f = open_or_throw(path);
  std::vector<uint8_t> data;
  uint8_t buf[65536];
  for (;;) {
    size_t want = sizeof buf;
    if (max_bytes != 0 && max_bytes - data.size() < want) want = max_bytes - data.size();
    if (want == 0) break;
    size_t n = std::fread(buf, 1, want, f.get());
    data.insert(data.end(), buf, buf + n);
    if (n < want) break;
  }
  if (std::ferror(f.get())) throw ImageError(path + ": read error");
  return data;
}

void check_size(const std::string& path, long long w, long long h) {
  if (w <= 0 || h <= 0) throw ImageError(path + ": the image has no pixels");
  if (w > kMaxImageSide || h > kMaxImageSide)
    throw ImageError(path + ": " + std::to_string(w) + "x" + std::to_string(h) + " is larger than " +
                     std::to_string(kMaxImageSide) + " pixels per side");
}

// ---- PNG: libpng's simplified API (png_image), which handles every bit depth and color type ----

struct PngImage {
  png_image image;
  PngImage() {
    std::memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
  }
  ~PngImage() { png_image_free(&image); }
};

void png_begin(const std::string& path, PngImage& png) {
  FilePtr probe = open_or_throw(path);  // a clear "cannot open" message first
  probe.reset();
  if (!png_image_begin_read_from_file(&png.image, path.c_str()))
    throw ImageError(path + ": PNG: " + png.image.message);
  check_size(path, png.image.width, png.image.height);
}

ImageRGB8 decode_png(const std::string& path) {
  PngImage png;
  png_begin(path, png);
  // RGBA, not RGB: the simplified API composites an alpha channel onto a background for RGB
  // output; PIL's convert("RGB") drops alpha instead, so read it and drop it here.
  png.image.format = PNG_FORMAT_RGBA;
  ImageRGB8 out;
  out.width = static_cast<int>(png.image.width);
  out.height = static_cast<int>(png.image.height);
  std::vector<uint8_t> rgba(PNG_IMAGE_SIZE(png.image));
  if (!png_image_finish_read(&png.image, nullptr, rgba.data(), 0, nullptr))
    throw ImageError(path + ": PNG: " + png.image.message);
  const size_t n = static_cast<size_t>(out.width) * out.height;
  out.pixels.resize(n * 3);
  for (size_t i = 0; i < n; ++i) std::memcpy(&out.pixels[i * 3], &rgba[i * 4], 3);
  return out;
}

// ---- JPEG: libjpeg with an error manager that longjmps back (libjpeg's documented pattern) ----

struct JpegErrorManager {
  jpeg_error_mgr base;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool corrupt;  // libjpeg warned about the data (truncated file, bad Huffman code, ...)
};

void jpeg_error_exit_longjmp(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// libjpeg reports damaged data as warnings (msg_level -1) and goes on with made-up pixels; like
// PIL's "image file is truncated", that is an error here. Trace messages (level >= 0) are ignored.
void jpeg_record_warning(j_common_ptr cinfo, int msg_level) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  if (msg_level < 0 && !err->corrupt) {
    (*cinfo->err->format_message)(cinfo, err->message);
    err->corrupt = true;
  }
}

// Decodes (or, with header_only, only sizes) a JPEG into *out. Returns false with err->message set
// on a libjpeg error. Only trivially destructible locals live between setjmp and longjmp here.
bool jpeg_decode_into(FILE* file, bool header_only, ImageRGB8* out, JpegErrorManager* err, bool* cmyk) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err->base);
  err->base.error_exit = jpeg_error_exit_longjmp;
  err->base.emit_message = jpeg_record_warning;
  err->message[0] = '\0';
  err->corrupt = false;
  if (setjmp(err->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_stdio_src(&cinfo, file);
  jpeg_read_header(&cinfo, TRUE);
  out->width = static_cast<int>(cinfo.image_width);
  out->height = static_cast<int>(cinfo.image_height);
  *cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  if (header_only || *cmyk || out->width <= 0 || out->height <= 0 || out->width > kMaxImageSide ||
      out->height > kMaxImageSide) {
    jpeg_destroy_decompress(&cinfo);
    return true;
  }
  cinfo.out_color_space = JCS_RGB;  // libjpeg converts YCbCr and grayscale
  jpeg_start_decompress(&cinfo);
  uint8_t* base = out->pixels.data();
  const size_t stride = static_cast<size_t>(out->width) * 3;
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = base + static_cast<size_t>(cinfo.output_scanline) * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

ImageRGB8 jpeg_read(const std::string& path, bool header_only) {
  ImageRGB8 out;
  JpegErrorManager err;
  bool cmyk = false;
  {
    FilePtr f = open_or_throw(path);
    if (!jpeg_decode_into(f.get(), true, &out, &err, &cmyk)) throw ImageError(path + ": JPEG: " + err.message);
  }
  check_size(path, out.width, out.height);
  if (cmyk) throw ImageError(path + ": JPEG: CMYK/YCCK images are not supported (convert the file to RGB)");
  if (header_only) return out;
  out.pixels.assign(static_cast<size_t>(out.width) * out.height * 3, 0);
  FilePtr f = open_or_throw(path);
  if (!jpeg_decode_into(f.get(), false, &out, &err, &cmyk) || err.corrupt)
    throw ImageError(path + ": JPEG: " + err.message);
  return out;
}

// ---- WebP: libwebp's simple decoding API ----

void webp_features(const std::string& path, const std::vector<uint8_t>& data, WebPBitstreamFeatures* features) {
  VP8StatusCode st = WebPGetFeatures(data.data(), data.size(), features);
  if (st != VP8_STATUS_OK) throw ImageError(path + ": WebP: not a valid WebP header (status " + std::to_string(st) + ")");
  check_size(path, features->width, features->height);
  if (features->has_animation) throw ImageError(path + ": WebP: animated images are not supported");
}

ImageRGB8 decode_webp(const std::string& path) {
  std::vector<uint8_t> data = read_bytes(path, 0);
  WebPBitstreamFeatures features;
  webp_features(path, data, &features);
  ImageRGB8 out;
  out.width = features.width;
  out.height = features.height;
  out.pixels.resize(static_cast<size_t>(out.width) * out.height * 3);
  const int stride = out.width * 3;
  if (!WebPDecodeRGBInto(data.data(), data.size(), out.pixels.data(), out.pixels.size(), stride))
    throw ImageError(path + ": WebP: the image data is corrupt");
  return out;
}

}  // namespace

const char* image_format_name(ImageFormat format) {
  switch (format) {
    case ImageFormat::Png: return "png";
    case ImageFormat::Jpeg: return "jpeg";
    case ImageFormat::WebP: return "webp";
    case ImageFormat::Unknown: break;
  }
  return "unknown";
}

ImageFormat detect_image_format(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint8_t head[12] = {0};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  const std::streamsize n = in.gcount();
  static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (n >= 8 && std::memcmp(head, png_sig, 8) == 0) return ImageFormat::Png;
  if (n >= 3 && head[0] == 0xff && head[1] == 0xd8 && head[2] == 0xff) return ImageFormat::Jpeg;
  if (n >= 12 && std::memcmp(head, "RIFF", 4) == 0 && std::memcmp(head + 8, "WEBP", 4) == 0) return ImageFormat::WebP;
  return ImageFormat::Unknown;
}

bool has_image_extension(const std::string& path) {
  size_t dot = path.rfind('.');
  if (dot == std::string::npos || path.find('/', dot) != std::string::npos) return false;
  std::string ext = path.substr(dot + 1);
  for (char& c : ext) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return ext == "png" || ext == "jpg" || ext == "jpeg" || ext == "webp";
}

ImageSize read_image_size(const std::string& path) {
  switch (detect_image_format(path)) {
    case ImageFormat::Png: {
      PngImage png;
      png_begin(path, png);
      return {static_cast<int>(png.image.width), static_cast<int>(png.image.height)};
    }
    case ImageFormat::Jpeg: {
      ImageRGB8 header = jpeg_read(path, true);
      return {header.width, header.height};
    }
    case ImageFormat::WebP: {
      // The headers (RIFF, VP8/VP8L/VP8X chunk) fit in the first kilobytes.
      std::vector<uint8_t> head = read_bytes(path, 64 * 1024);
      WebPBitstreamFeatures features;
      webp_features(path, head, &features);
      return {features.width, features.height};
    }
    case ImageFormat::Unknown: break;
  }
  open_or_throw(path);
  throw ImageError(path + ": not a PNG, JPEG or WebP file");
}

ImageRGB8 decode_image(const std::string& path) {
  switch (detect_image_format(path)) {
    case ImageFormat::Png: return decode_png(path);
    case ImageFormat::Jpeg: return jpeg_read(path, false);
    case ImageFormat::WebP: return decode_webp(path);
    case ImageFormat::Unknown: break;
  }
  open_or_throw(path);
  throw ImageError(path + ": not a PNG, JPEG or WebP file");
}

void write_png_rgb8(const std::string& path, const ImageRGB8& img) {
  if (img.width <= 0 || img.height <= 0 || img.pixels.size() != static_cast<size_t>(img.width) * img.height * 3)
    throw ImageError(path + ": cannot write an image of " + std::to_string(img.width) + "x" +
                     std::to_string(img.height) + " pixels from " + std::to_string(img.pixels.size()) + " bytes");
  PngImage png;
  png.image.width = static_cast<png_uint_32>(img.width);
  png.image.height = static_cast<png_uint_32>(img.height);
  png.image.format = PNG_FORMAT_RGB;
  if (!png_image_write_to_file(&png.image, path.c_str(), 0, img.pixels.data(), 0, nullptr))
    throw ImageError(path + ": PNG: " + png.image.message);
}

}  // namespace flame_train
