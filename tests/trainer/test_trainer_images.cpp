// flame-train: decoding PNG / JPEG / WebP through the codec libraries, the resampler, and the crop
// to float CHW in [-1, 1]. Every image is written here with the libraries' encoders.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "image_writers.h"
#include "images.h"
#include "resample.h"

using namespace flame_train;
using flame_train_test::TempDir;

namespace {

int max_abs_diff(const ImageRGB8& a, const ImageRGB8& b) {
  int m = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) m = std::max(m, std::abs(int(a.pixels[i]) - int(b.pixels[i])));
  return m;
}

// Keeps the first half of the file (the header stays readable, the pixel data is cut).
void truncate_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  ASSERT_GT(data.size(), 60u);
  flame_train_test::write_text(path, data.substr(0, data.size() / 2));
}

}  // namespace

TEST(TrainerImages, PngRgbRoundTripsExactly) {
  TempDir dir;
  ImageRGB8 img = flame_train_test::pattern_image(37, 23);
  flame_train_test::write_png(dir.file("a.png"), img);
  EXPECT_EQ(detect_image_format(dir.file("a.png")), ImageFormat::Png);
  ImageRGB8 back = decode_image(dir.file("a.png"));
  ASSERT_EQ(back.width, 37);
  ASSERT_EQ(back.height, 23);
  EXPECT_EQ(back.pixels, img.pixels);
  ImageSize size = read_image_size(dir.file("a.png"));
  EXPECT_EQ(size.width, 37);
  EXPECT_EQ(size.height, 23);
}

TEST(TrainerImages, PngGrayIsReplicatedAndAlphaIsDropped) {
  TempDir dir;
  std::vector<uint8_t> gray = {0, 50, 100, 150, 200, 250};
  flame_train_test::write_png(dir.file("g.png"), 3, 2, PNG_FORMAT_GRAY, gray);
  ImageRGB8 g = decode_image(dir.file("g.png"));
  ASSERT_EQ(g.pixels.size(), 18u);
  for (size_t i = 0; i < 6; ++i)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(g.pixels[i * 3 + c], gray[i]) << i;
  // RGBA with partly transparent pixels: the RGB values come back unchanged (PIL's convert("RGB")).
  std::vector<uint8_t> rgba = {10, 20, 30, 255, 40, 50, 60, 0, 70, 80, 90, 128, 200, 210, 220, 1};
  flame_train_test::write_png(dir.file("a.png"), 2, 2, PNG_FORMAT_RGBA, rgba);
  ImageRGB8 a = decode_image(dir.file("a.png"));
  ASSERT_EQ(a.pixels.size(), 12u);
  for (size_t i = 0; i < 4; ++i)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(a.pixels[i * 3 + c], rgba[i * 4 + c]) << i;
}

TEST(TrainerImages, PalettePngIsExpanded) {
  TempDir dir;
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = 3;
  image.height = 1;
  image.format = PNG_FORMAT_RGB_COLORMAP;
  image.colormap_entries = 2;
  const uint8_t colormap[6] = {255, 0, 0, 10, 200, 30};
  const uint8_t indices[3] = {1, 0, 1};
  ASSERT_TRUE(png_image_write_to_file(&image, dir.file("p.png").c_str(), 0, indices, 0, colormap)) << image.message;
  ImageRGB8 p = decode_image(dir.file("p.png"));
  EXPECT_EQ(p.pixels, (std::vector<uint8_t>{10, 200, 30, 255, 0, 0, 10, 200, 30}));
}

TEST(TrainerImages, CmykJpegIsRefusedClearly) {
  TempDir dir;
  const std::string path = dir.file("cmyk.jpg");
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, f);
  cinfo.image_width = 4;
  cinfo.image_height = 2;
  cinfo.input_components = 4;
  cinfo.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  std::vector<uint8_t> row(16, 100);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW r = row.data();
    jpeg_write_scanlines(&cinfo, &r, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::fclose(f);
  try {
    decode_image(path);
    ADD_FAILURE() << "a CMYK JPEG was decoded";
  } catch (const ImageError& e) {
    EXPECT_NE(std::string(e.what()).find("CMYK/YCCK images are not supported"), std::string::npos) << e.what();
  }
}

TEST(TrainerImages, JpegRgbAndGrayDecodeCloseToTheSource) {
  TempDir dir;
  ImageRGB8 img = flame_train_test::pattern_image(64, 48);
  flame_train_test::write_jpeg(dir.file("a.jpg"), img, 100);
  EXPECT_EQ(detect_image_format(dir.file("a.jpg")), ImageFormat::Jpeg);
  ImageRGB8 back = decode_image(dir.file("a.jpg"));
  ASSERT_EQ(back.width, 64);
  ASSERT_EQ(back.height, 48);
  EXPECT_LE(max_abs_diff(back, img), 40);  // chroma subsampling of a sharp pattern; mean is tighter
  double mean = 0;
  for (size_t i = 0; i < img.pixels.size(); ++i) mean += std::abs(int(back.pixels[i]) - int(img.pixels[i]));
  EXPECT_LT(mean / img.pixels.size(), 3.0);
  EXPECT_EQ(read_image_size(dir.file("a.jpg")).width, 64);

  std::vector<uint8_t> gray(16 * 8);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = static_cast<uint8_t>(i * 2);
  flame_train_test::write_jpeg(dir.file("g.jpeg"), 16, 8, 1, gray, 100);
  ImageRGB8 g = decode_image(dir.file("g.jpeg"));
  ASSERT_EQ(g.pixels.size(), 16u * 8 * 3);
  for (size_t i = 0; i < gray.size(); ++i) {
    EXPECT_EQ(g.pixels[i * 3], g.pixels[i * 3 + 1]);
    EXPECT_EQ(g.pixels[i * 3], g.pixels[i * 3 + 2]);
    EXPECT_NEAR(g.pixels[i * 3], gray[i], 3) << i;
  }
}

TEST(TrainerImages, WebpLosslessRoundTripsExactly) {
  TempDir dir;
  ImageRGB8 img = flame_train_test::pattern_image(31, 17);
  flame_train_test::write_webp(dir.file("a.webp"), img);
  EXPECT_EQ(detect_image_format(dir.file("a.webp")), ImageFormat::WebP);
  ImageRGB8 back = decode_image(dir.file("a.webp"));
  ASSERT_EQ(back.width, 31);
  ASSERT_EQ(back.height, 17);
  EXPECT_EQ(back.pixels, img.pixels);
  ImageSize size = read_image_size(dir.file("a.webp"));
  EXPECT_EQ(size.width, 31);
  EXPECT_EQ(size.height, 17);
}

TEST(TrainerImages, FormatComesFromTheContentNotTheName) {
  TempDir dir;
  ImageRGB8 img = flame_train_test::pattern_image(5, 4);
  flame_train_test::write_png(dir.file("really_png.jpg"), img);
  EXPECT_EQ(decode_image(dir.file("really_png.jpg")).pixels, img.pixels);
  EXPECT_TRUE(has_image_extension("x/a.PNG"));
  EXPECT_TRUE(has_image_extension("a.JpEg"));
  EXPECT_TRUE(has_image_extension("a.webp"));
  EXPECT_FALSE(has_image_extension("a.txt"));
  EXPECT_FALSE(has_image_extension("dir.png/file"));
  EXPECT_FALSE(has_image_extension("png"));
}

// Expects decode_image (and read_image_size when header_too) to throw an ImageError whose message
// contains each of the fragments.
void expect_image_error(const std::string& path, const std::vector<std::string>& fragments, bool header_too) {
  for (int pass = 0; pass < (header_too ? 2 : 1); ++pass) {
    try {
      if (pass == 0) decode_image(path);
      else read_image_size(path);
      ADD_FAILURE() << path << ": no error (pass " << pass << ")";
    } catch (const ImageError& e) {
      for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
  }
}

TEST(TrainerImages, BadFilesAreClearErrors) {
  TempDir dir;
  expect_image_error(dir.file("missing.png"), {"missing.png", "cannot open"}, true);
  flame_train_test::write_text(dir.file("text.png"), "this is not an image at all");
  expect_image_error(dir.file("text.png"), {"text.png", "not a PNG, JPEG or WebP"}, true);

  ImageRGB8 img = flame_train_test::pattern_image(64, 64);
  flame_train_test::write_png(dir.file("cut.png"), img);
  truncate_file(dir.file("cut.png"));
  expect_image_error(dir.file("cut.png"), {"cut.png", "PNG"}, false);

  flame_train_test::write_jpeg(dir.file("cut.jpg"), img);
  truncate_file(dir.file("cut.jpg"));
  expect_image_error(dir.file("cut.jpg"), {"cut.jpg", "JPEG"}, false);

  flame_train_test::write_webp(dir.file("cut.webp"), img);
  truncate_file(dir.file("cut.webp"));
  expect_image_error(dir.file("cut.webp"), {"cut.webp", "WebP"}, false);

  // Too wide (a 1-pixel-high PNG is small on disk): refused from the header.
  std::vector<uint8_t> wide(static_cast<size_t>(kMaxImageSide + 1) * 3, 128);
  flame_train_test::write_png(dir.file("wide.png"), kMaxImageSide + 1, 1, PNG_FORMAT_RGB, wide);
  expect_image_error(dir.file("wide.png"), {"wide.png", "larger than 16384"}, true);
}

TEST(TrainerResample, SameSizeIsTheIdentityForEveryFilter) {
  ImageRGB8 img = flame_train_test::pattern_image(13, 9);
  for (ResampleFilter f : {ResampleFilter::Box, ResampleFilter::Triangle, ResampleFilter::Lanczos3}) {
    ImageF32 out = resize_image(img, 13, 9, f);
    for (size_t i = 0; i < img.pixels.size(); ++i) ASSERT_NEAR(out.pixels[i], img.pixels[i], 1e-3) << i;
  }
}

TEST(TrainerResample, FlatImagesStayFlat) {
  ImageRGB8 img;
  img.width = 50;
  img.height = 30;
  img.pixels.assign(50 * 30 * 3, 77);
  for (auto size : {std::pair<int, int>{17, 11}, {120, 64}, {50, 7}, {1, 1}}) {
    ImageF32 out = resize_image(img, size.first, size.second);
    for (float v : out.pixels) ASSERT_NEAR(v, 77.0f, 1e-3f);
  }
}

TEST(TrainerResample, BoxHalvingIsTheBlockMean) {
  ImageRGB8 img = flame_train_test::pattern_image(8, 6);
  ImageF32 out = resize_image(img, 4, 3, ResampleFilter::Box);
  for (int y = 0; y < 3; ++y)
    for (int x = 0; x < 4; ++x)
      for (int c = 0; c < 3; ++c) {
        auto px = [&](int xx, int yy) { return float(img.pixels[(size_t(yy) * 8 + xx) * 3 + c]); };
        float mean = (px(2 * x, 2 * y) + px(2 * x + 1, 2 * y) + px(2 * x, 2 * y + 1) + px(2 * x + 1, 2 * y + 1)) / 4;
        EXPECT_NEAR(out.pixels[(size_t(y) * 4 + x) * 3 + c], mean, 1e-3) << x << "," << y << "," << c;
      }
}

TEST(TrainerResample, LanczosShrinkKeepsALinearRampAwayFromTheBorders) {
  // A symmetric kernel with normalised weights reproduces linear functions: out = ramp(center).
  ImageRGB8 img;
  img.width = 64;
  img.height = 4;
  img.pixels.resize(64 * 4 * 3);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 64; ++x)
      for (int c = 0; c < 3; ++c) img.pixels[(size_t(y) * 64 + x) * 3 + c] = static_cast<uint8_t>(3 * x + c);
  ImageF32 out = resize_image(img, 16, 4);  // factor 4: support 12 input pixels each side
  for (int x = 3; x < 13; ++x) {
    const double center = (x + 0.5) * 4 - 0.5;  // in input pixel indices
    for (int c = 0; c < 3; ++c) EXPECT_NEAR(out.pixels[size_t(x) * 3 + c], 3 * center + c, 1e-2) << x;
  }
}

TEST(TrainerResample, CropToTensorMapsRangeFlipsAndChecksTheWindow) {
  ImageF32 img;
  img.width = 4;
  img.height = 2;
  img.pixels.resize(4 * 2 * 3);
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 4; ++x) {
      float* p = &img.pixels[(size_t(y) * 4 + x) * 3];
      p[0] = x == 0 ? 0.0f : 255.0f;  // column 0 black in R
      p[1] = 51.0f * x;
      p[2] = y == 0 ? -20.0f : 300.0f;  // overshoot is clamped
    }
  std::vector<float> t(3 * 2 * 3);
  crop_to_tensor(img, 1, 0, 3, 2, false, t.data());  // columns 1..3
  EXPECT_FLOAT_EQ(t[0], 1.0f);                        // R at (x=1, y=0)
  EXPECT_FLOAT_EQ(t[6 + 0], 51.0f / 127.5f - 1.0f);   // G plane, (x=1, y=0)
  EXPECT_FLOAT_EQ(t[12 + 0], -1.0f);                  // B plane, y=0 clamped to 0
  EXPECT_FLOAT_EQ(t[12 + 3], 1.0f);                   // B plane, y=1 clamped to 255
  std::vector<float> f(3 * 2 * 3);
  crop_to_tensor(img, 1, 0, 3, 2, true, f.data());
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 2; ++y)
      for (int x = 0; x < 3; ++x) EXPECT_EQ(f[c * 6 + y * 3 + x], t[c * 6 + y * 3 + (2 - x)]);
  EXPECT_THROW(crop_to_tensor(img, 2, 0, 3, 2, false, t.data()), std::invalid_argument);
  EXPECT_THROW(crop_to_tensor(img, 0, 1, 4, 2, false, t.data()), std::invalid_argument);
  ImageRGB8 empty;
  EXPECT_THROW(resize_image(empty, 4, 4), std::invalid_argument);
}
