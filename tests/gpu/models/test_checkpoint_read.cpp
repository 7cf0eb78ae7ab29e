// CheckpointFiles::read_into on a GPU (white-box, src/models/checkpoint_files.*): whole tensors and
// dim-0 row ranges, f32 <-> bf16 / f16 conversion and same-dtype copies, destinations of another
// shape or strided, 0-d and integer tensors, tensors larger than the staging piece (several pieces,
// with and without conversion), reads through a prefix view and from a second shard, F8 storage
// (converted when FLAME has the dtype, else a clear error), errors that leave the destination
// untouched, the load statistics, and the same reads through pinned uploads (pinned_upload.h). Without a GPU the tests skip unless FLAME_REQUIRE_GPU=1.
#include <gtest/gtest.h>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>
#include "core/error.h"
#include "flame_test.h"
#include "models/checkpoint_files.h"
#include "models/pinned_upload.h"
#include "ops/ops.h"
#include "synthetic_checkpoint.h"

using namespace flame;
using namespace flame::models;

namespace {

std::vector<unsigned char> bytes_of(const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  return std::vector<unsigned char>(b, b + n);
}

// f32 -> bf16 rounding to nearest even, written out here rather than taken from FLAME.
uint16_t bf16_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float bf16_value(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// 6 x 4 f32 values, several of which bf16 and f16 must round.
std::vector<float> w_values() {
  std::vector<float> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.3713f - 3.1f + (i % 3 ? 1e-3f : 0.0f);
  return v;
}

class CheckpointRead : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (!ctx) return;
    c = ctx->ctx;
    const std::vector<float> w = w_values();
    std::vector<uint16_t> b(15), h(4);
    for (size_t i = 0; i < b.size(); ++i) b[i] = bf16_rne(static_cast<float>(i) * 0.75f - 5.0f);
    for (size_t i = 0; i < h.size(); ++i) h[i] = float_to_half_bits(static_cast<float>(i) * 1.5f - 2.0f);
    const float s = 2.5f;
    const int64_t ids[3] = {7, -1, int64_t(1) << 40};
    // F8_E4M3: 1, 2, -2, 0, 1.5, 3; F8_E5M2: 1, 2, -3, 1.5.
    path = dir.sub("m.safetensors");
    synth::write_safetensors(path, {{"model.diffusion_model.w", "F32", {6, 4}, bytes_of(w.data(), 96)},
                                    {"b", "BF16", {5, 3}, bytes_of(b.data(), 30)},
                                    {"h", "F16", {4}, bytes_of(h.data(), 8)},
                                    {"s", "F32", {}, bytes_of(&s, 4)},
                                    {"ids", "I64", {3}, bytes_of(ids, 24)},
                                    {"e4m3", "F8_E4M3", {6}, {0x38, 0x40, 0xC0, 0x00, 0x3C, 0x44}},
                                    {"e5m2", "F8_E5M2", {4}, {0x3C, 0x40, 0xC2, 0x3E}}});
  }

  Context& context() { return *c; }
  Tensor empty(const Shape& shape, DType dtype) { return ops::empty(*c, shape, dtype); }
  template <class T>
  std::vector<T> host(const Tensor& t) {
    std::vector<T> v(static_cast<size_t>(t->numel()));
    ops::to_host(t, v.data(), v.size() * sizeof(T));
    return v;
  }

  Context* c = nullptr;
  synth::TempDir dir;
  std::string path;
};

}  // namespace

TEST_F(CheckpointRead, WholeTensorsAndConversions) {
  ContextScope scope(context());
  const CheckpointFiles cf = CheckpointFiles::open(path);
  const CheckpointFiles unet = cf.with_prefix("model.diffusion_model.");
  const std::vector<float> w = w_values();

  Tensor f32 = empty({6, 4}, FLAME_DTYPE_F32);
  unet.read_into("w", f32);
  EXPECT_EQ(host<float>(f32), w);

  Tensor bf = empty({24}, FLAME_DTYPE_BF16);  // another shape of the same count
  unet.read_into("w", bf);
  const std::vector<uint16_t> bf_bits = host<uint16_t>(bf);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(bf_bits[i], bf16_rne(w[i])) << i;

  Tensor hf = empty({4, 6}, FLAME_DTYPE_F16);
  unet.read_into("w", hf);
  const std::vector<uint16_t> hf_bits = host<uint16_t>(hf);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(hf_bits[i], float_to_half_bits(w[i])) << i;

  Tensor from_bf = empty({5, 3}, FLAME_DTYPE_F32);
  cf.read_into("b", from_bf);
  const std::vector<float> from_bf_v = host<float>(from_bf);
  for (size_t i = 0; i < 15; ++i) EXPECT_EQ(from_bf_v[i], bf16_value(bf16_rne(static_cast<float>(i) * 0.75f - 5.0f))) << i;

  Tensor from_h = empty({4}, FLAME_DTYPE_F32);
  cf.read_into("h", from_h);
  EXPECT_EQ(host<float>(from_h), (std::vector<float>{-2.0f, -0.5f, 1.0f, 2.5f}));

  Tensor bf_to_h = empty({15}, FLAME_DTYPE_F16);  // bf16 -> f16 (values exact in both)
  cf.read_into("b", bf_to_h);
  const std::vector<uint16_t> bf_to_h_bits = host<uint16_t>(bf_to_h);
  for (size_t i = 0; i < 15; ++i) EXPECT_EQ(bf_to_h_bits[i], float_to_half_bits(static_cast<float>(i) * 0.75f - 5.0f)) << i;

  Tensor s0 = empty({}, FLAME_DTYPE_F32), s1 = empty({1}, FLAME_DTYPE_BF16);
  cf.read_into("s", s0);
  cf.read_into("s", s1, 0, 1);
  EXPECT_EQ(host<float>(s0)[0], 2.5f);
  EXPECT_EQ(host<uint16_t>(s1)[0], bf16_rne(2.5f));

  Tensor ids = empty({3}, FLAME_DTYPE_I64);
  cf.read_into("ids", ids);
  EXPECT_EQ(host<int64_t>(ids), (std::vector<int64_t>{7, -1, int64_t(1) << 40}));
}

TEST_F(CheckpointRead, RowRanges) {
  ContextScope scope(context());
  const CheckpointFiles unet = CheckpointFiles::open(path).with_prefix("model.diffusion_model.");
  const std::vector<float> w = w_values();
  Tensor mid = empty({2, 4}, FLAME_DTYPE_F32);
  unet.read_into("w", mid, 1, 2);
  EXPECT_EQ(host<float>(mid), std::vector<float>(w.begin() + 4, w.begin() + 12));
  Tensor tail = empty({8}, FLAME_DTYPE_BF16);
  unet.read_into("w", tail, 4);  // rows = -1: to the end
  const std::vector<uint16_t> tail_bits = host<uint16_t>(tail);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(tail_bits[i], bf16_rne(w[16 + i])) << i;
  Tensor none = empty({0, 4}, FLAME_DTYPE_F16);
  unet.read_into("w", none, 6, 0);
  Tensor rows_b = empty({3}, FLAME_DTYPE_F32);
  CheckpointFiles::open(path).read_into("b", rows_b, 4, 1);
  const std::vector<float> rows_b_v = host<float>(rows_b);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rows_b_v[i], bf16_value(bf16_rne(static_cast<float>(12 + i) * 0.75f - 5.0f)));
}

TEST_F(CheckpointRead, StridedDestination) {
  ContextScope scope(context());
  const CheckpointFiles unet = CheckpointFiles::open(path).with_prefix("model.diffusion_model.");
  const std::vector<float> w = w_values();
  for (DType dt : {FLAME_DTYPE_F32, FLAME_DTYPE_BF16}) {
    Tensor base = empty({4, 6}, dt);
    Tensor transposed = make_view(base, {6, 4}, {1, 6}, 0);  // element (r, k) at base[k][r]
    unet.read_into("w", transposed);
    Tensor back = ops::to_dtype(base, FLAME_DTYPE_F32);
    const std::vector<float> got = host<float>(back);
    for (int r = 0; r < 6; ++r)
      for (int k = 0; k < 4; ++k) {
        const float want = dt == FLAME_DTYPE_F32 ? w[r * 4 + k] : bf16_value(bf16_rne(w[r * 4 + k]));
        EXPECT_EQ(got[k * 6 + r], want) << r << "," << k;
      }
  }
}

TEST_F(CheckpointRead, SeveralStagingPieces) {
  ContextScope scope(context());
  // A 2-byte tensor of more than kStagingBytes: the pieces must join without a gap or an overlap.
  const int64_t n = static_cast<int64_t>(kStagingBytes / 2) + 12345;
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) bits[static_cast<size_t>(i)] = float_to_half_bits(static_cast<float>(i % 2048 - 1024));
  const std::string big = dir.sub("big.safetensors");
  synth::write_safetensors(big, {{"x", "F16", {n / 5, 5}, bytes_of(bits.data(), static_cast<size_t>(n / 5 * 5) * 2)}});
  const int64_t m = n / 5 * 5;
  const CheckpointFiles cf = CheckpointFiles::open(big);
  Tensor same = empty({m}, FLAME_DTYPE_F16);
  cf.read_into("x", same);
  EXPECT_TRUE(host<uint16_t>(same) == std::vector<uint16_t>(bits.begin(), bits.begin() + m));
  Tensor wide = empty({m}, FLAME_DTYPE_F32);
  cf.read_into("x", wide);
  const std::vector<float> got = host<float>(wide);
  int64_t bad = 0;
  for (int64_t i = 0; i < m; ++i) bad += got[static_cast<size_t>(i)] != static_cast<float>(i % 2048 - 1024);
  EXPECT_EQ(bad, 0);
  // Rows that start beyond the first piece of a whole read (the source offset, not the piece, moves).
  const int64_t first_row = static_cast<int64_t>(kStagingBytes / 2) / 5 - 3;
  Tensor rows = empty({10, 5}, FLAME_DTYPE_F32);
  cf.read_into("x", rows, first_row, 10);
  const std::vector<float> rows_v = host<float>(rows);
  for (int64_t i = 0; i < 50; ++i)
    EXPECT_EQ(rows_v[static_cast<size_t>(i)], static_cast<float>((first_row * 5 + i) % 2048 - 1024)) << i;
  const LoadStats st = cf.load_stats();
  EXPECT_EQ(st.bytes, static_cast<uint64_t>(m) * 4 + 100);
  EXPECT_GT(st.seconds, 0.0);
  EXPECT_GT(st.gb_per_s(), 0.0);
}

// The same reads while a PinnedUploads scope is open (model_loader.cpp opens one around a model's
// parameters): tensors go through two pinned buffers of kPinnedPieceBytes filled by several threads.
TEST_F(CheckpointRead, PinnedUploadsEqualThePageablePath) {
  ContextScope scope(context());
  const int64_t n = static_cast<int64_t>(kStagingBytes / 2) * 2 + 777;  // several staging and pinned pieces
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) bits[static_cast<size_t>(i)] = float_to_half_bits(static_cast<float>((i * 7) % 2039 - 1000));
  const int64_t m = n / 7 * 7;
  const std::string big = dir.sub("pinned.safetensors");
  synth::write_safetensors(big, {{"x", "F16", {m / 7, 7}, bytes_of(bits.data(), static_cast<size_t>(m) * 2)},
                                 {"small", "F16", {3}, bytes_of(bits.data(), 6)}});
  const CheckpointFiles cf = CheckpointFiles::open(big);
  const std::vector<uint16_t> want(bits.begin(), bits.begin() + m);
  {
    const CheckpointFiles::PinnedUploads pinned(cf, context());
    EXPECT_THROW(CheckpointFiles::PinnedUploads second(cf, context()), Error);  // one at a time
    Tensor same = empty({m}, FLAME_DTYPE_F16);
    cf.read_into("x", same);
    EXPECT_TRUE(host<uint16_t>(same) == want);
    Tensor wide = empty({m / 7, 7}, FLAME_DTYPE_F32);  // converted through the device staging buffer
    cf.with_prefix("").read_into("x", wide);           // a copy of the view shares the scope
    const std::vector<float> got = host<float>(wide);
    int64_t bad = 0;
    for (int64_t i = 0; i < m; ++i) bad += got[static_cast<size_t>(i)] != static_cast<float>((i * 7) % 2039 - 1000);
    EXPECT_EQ(bad, 0);
    Tensor t = empty({7, m / 7}, FLAME_DTYPE_F16);  // strided destination
    cf.read_into("x", ops::transpose(t, 0, 1));
    const std::vector<uint16_t> tv = host<uint16_t>(t);
    bad = 0;
    for (int64_t r = 0; r < m / 7; ++r)
      for (int64_t k = 0; k < 7; ++k) bad += tv[static_cast<size_t>(k * (m / 7) + r)] != want[static_cast<size_t>(r * 7 + k)];
    EXPECT_EQ(bad, 0);
    Tensor small = empty({3}, FLAME_DTYPE_F16);  // below kPinnedMinBytes: straight from the mapping
    cf.read_into("small", small);
    EXPECT_TRUE(host<uint16_t>(small) == std::vector<uint16_t>(bits.begin(), bits.begin() + 3));
  }
  Tensor after = empty({m}, FLAME_DTYPE_F16);  // the scope closed: the pageable path again
  cf.read_into("x", after);
  EXPECT_TRUE(host<uint16_t>(after) == want);
}

TEST(PinnedUpload, ParallelCopyJoinsItsPartsExactly) {
  for (size_t n : {size_t(0), size_t(1), size_t(4) << 20, (size_t(17) << 20) + 3}) {
    std::vector<unsigned char> src(n), dst(n, 0);
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<unsigned char>(i * 131 + (i >> 12));
    for (unsigned threads : {1u, 3u, 8u}) {
      std::fill(dst.begin(), dst.end(), 0);
      parallel_copy(dst.data(), src.data(), n, threads);
      EXPECT_TRUE(dst == src) << n << " bytes, " << threads << " threads";
    }
  }
}

TEST_F(CheckpointRead, F8Storage) {
  ContextScope scope(context());
  const CheckpointFiles cf = CheckpointFiles::open(path);
  const std::vector<std::pair<std::string, std::vector<float>>> cases{{"e4m3", {1, 2, -2, 0, 1.5f, 3}},
                                                                      {"e5m2", {1, 2, -3, 1.5f}}};
  for (const auto& [key, want] : cases) {
    SCOPED_TRACE(key);
    Tensor dst = empty({static_cast<int64_t>(want.size())}, FLAME_DTYPE_F32);
    if (cf.stored(key).supported) {  // FLAME has the dtype: converted on the GPU
      cf.read_into(key, dst);
      EXPECT_EQ(host<float>(dst), want);
    } else {
      try {
        cf.read_into(key, dst);
        ADD_FAILURE() << "no error for a dtype FLAME lacks";
      } catch (const Error& e) {
        EXPECT_EQ(e.status(), FLAME_ERROR_UNSUPPORTED);
        EXPECT_NE(std::string(e.what()).find(path + ": key '" + key + "'"), std::string::npos) << e.what();
      }
    }
  }
}

TEST_F(CheckpointRead, ShardsErrorsAndStatistics) {
  ContextScope scope(context());
  const std::string folder = dir.sub("t", true);
  synth::write_text(folder + "/config.json", "{}");
  const float a[2] = {1.0f, -1.0f}, b[3] = {4.0f, 5.0f, 6.0f};
  synth::write_safetensors(folder + "/model-1.safetensors", {{"a", "F32", {2}, bytes_of(a, 8)}});
  synth::write_safetensors(folder + "/model-2.safetensors", {{"b", "F32", {3}, bytes_of(b, 12)}});
  synth::write_text(folder + "/model.safetensors.index.json",
                    "{\"weight_map\": {\"a\": \"model-1.safetensors\", \"b\": \"model-2.safetensors\"}}");
  const CheckpointFiles cf = CheckpointFiles::open(folder);
  const CheckpointFiles view = cf.with_prefix("b");
  Tensor dst = empty({3}, FLAME_DTYPE_BF16);
  view.read_into("", dst);
  EXPECT_EQ(host<uint16_t>(dst), (std::vector<uint16_t>{bf16_rne(4), bf16_rne(5), bf16_rne(6)}));
  EXPECT_EQ(cf.load_stats().bytes, 12u);  // the view's read counts for the files it shares

  // A wrong element count: an error naming the file and key, the destination untouched.
  Tensor wrong = empty({4}, FLAME_DTYPE_F32);
  ops::fill_(wrong, 9.0);
  try {
    cf.read_into("b", wrong);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), FLAME_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find(folder + "/model-2.safetensors: key 'b'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(host<float>(wrong), (std::vector<float>{9, 9, 9, 9}));
  EXPECT_EQ(cf.load_stats().bytes, 12u);  // failures count nothing
}
