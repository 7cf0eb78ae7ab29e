// flame.h "safetensors" on a GPU: save -> load round trips in every dtype, for 0-d, empty,
// contiguous and non-contiguous tensors (transposed, strided slices, flipped, expanded, permuted),
// with values compared byte for byte against the host reference's row-major encoding; metadata;
// files of zero tensors; a tensor larger than the 64 MiB copy piece; tensors of dtypes FLAME lacks
// and of more than FLAME_MAX_DIMS dims in hand-made files; malformed files, I/O errors and argument
// errors with their statuses (OUT values NULL, nothing written); lifetimes (tensors outlive the
// file handle, the handle keeps its context alive, released handles are detected) and concurrent
// reads from one handle.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>
#include "host_ref.h"

using namespace href;

namespace {

using Bytes = std::vector<unsigned char>;

// A scratch directory, removed with its files.
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : std::string("/tmp")) +
                       "/flame-st-gpu-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (char* d = mkdtemp(buf.data())) path = d;
    EXPECT_FALSE(path.empty()) << "mkdtemp failed";
  }
  ~TempDir() {
    for (const std::string& f : files()) std::remove((path + "/" + f).c_str());
    rmdir(path.c_str());
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
  std::vector<std::string> files() const {
    std::vector<std::string> v;
    if (DIR* d = opendir(path.c_str())) {
      while (dirent* e = readdir(d))
        if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) v.push_back(e->d_name);
      closedir(d);
    }
    std::sort(v.begin(), v.end());
    return v;
  }
};

// RAII holder for a file handle.
struct File {
  flame_safetensors_t h = nullptr;
  File() = default;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() { flame_safetensors_release(h); }
  flame_safetensors_t* out() {
    flame_safetensors_release(h);
    h = nullptr;
    return &h;
  }
  operator flame_safetensors_t() const { return h; }
};

Bytes bytes_of(flame_tensor_t t) {
  Bytes b(static_cast<size_t>(numel_of(t)) * dsize(dtype_of(t)) + 1);  // +1: a valid pointer when empty
  flame_status_t st = flame_to_host(t, b.data(), b.size() - 1);
  EXPECT_EQ(st, FLAME_OK) << flame_last_error_message();
  b.pop_back();
  return b;
}

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// A safetensors file made by hand: length prefix, json, data.
Bytes raw_file(const std::string& json, const Bytes& data) {
  Bytes f(8);
  for (int i = 0; i < 8; ++i) f[i] = static_cast<unsigned char>(static_cast<uint64_t>(json.size()) >> (8 * i));
  f.insert(f.end(), json.begin(), json.end());
  f.insert(f.end(), data.begin(), data.end());
  return f;
}

std::vector<std::string> names_of(flame_safetensors_t f) {
  int64_t n = -1;
  EXPECT_EQ(flame_safetensors_count(f, &n), FLAME_OK) << flame_last_error_message();
  std::vector<std::string> v;
  for (int64_t i = 0; i < n; ++i) {
    const char* s = nullptr;
    EXPECT_EQ(flame_safetensors_name(f, i, &s), FLAME_OK) << flame_last_error_message();
    v.push_back(s ? s : "<null>");
  }
  return v;
}

flame_status_t save(flame_ctx_t ctx, const std::string& path, const std::vector<std::string>& names,
                    const std::vector<flame_tensor_t>& ts, const std::vector<std::string>& kv = {}) {
  std::vector<const char*> n, m;
  for (const auto& s : names) n.push_back(s.c_str());
  for (const auto& s : kv) m.push_back(s.c_str());
  return flame_safetensors_save(ctx, path.c_str(), n.empty() ? nullptr : n.data(), ts.empty() ? nullptr : ts.data(),
                                static_cast<int64_t>(ts.size()), m.empty() ? nullptr : m.data(),
                                static_cast<int64_t>(m.size() / 2));
}

// One tensor to save: the device tensor (maybe a view) and its expected row-major bytes.
struct Item {
  std::string name;
  T t;
  Shape shape;
  flame_dtype_t dtype;
  Bytes expect;
};

class Safetensors : public GpuTest {
 protected:
  // The tensors of the round-trip test: every dtype, 0-d, empty, contiguous and five kinds of view.
  std::vector<Item> every_kind(Rng& rng) {
    std::vector<Item> items;
    for (flame_dtype_t d : kAllDtypes) {
      const std::string p = std::string(dname(d)) + ".";
      auto add = [&](const std::string& name, T t, const HT& h) {
        Item it;
        it.name = p + name;
        it.shape = h.shape;
        it.dtype = d;
        it.expect = encode(h.values(), d);
        it.t = std::move(t);
        items.push_back(std::move(it));
      };
      for (const Shape& s : std::vector<Shape>{{}, {7}, {3, 5}, {2, 3, 4}, {0}, {2, 0, 3}}) {
        HT h = random(rng, s, d);
        add("c" + to_string(s), upload(ctx, h), h);
      }
      {
        HT h = random(rng, {4, 6}, d);
        T base = upload(ctx, h), v;
        EXPECT_EQ(flame_transpose(base, 0, 1, v.out()), FLAME_OK) << flame_last_error_message();
        add("transposed", std::move(v), h.transpose(0, 1));
      }
      {
        HT h = random(rng, {10, 3}, d);
        T base = upload(ctx, h), v;
        EXPECT_EQ(flame_slice(base, 0, 1, 9, 3, v.out()), FLAME_OK) << flame_last_error_message();
        add("sliced", std::move(v), h.slice(0, 1, 9, 3));
      }
      {
        HT h = random(rng, {3, 4}, d);
        T base = upload(ctx, h), v;
        const int32_t dims[] = {1};
        EXPECT_EQ(flame_flip(base, dims, 1, v.out()), FLAME_OK) << flame_last_error_message();
        add("flipped", std::move(v), h.flip({1}));
      }
      {
        HT h = random(rng, {3, 1}, d);
        T base = upload(ctx, h), v;
        const int64_t to[] = {3, 5};
        EXPECT_EQ(flame_expand(base, to, 2, v.out()), FLAME_OK) << flame_last_error_message();
        add("expanded", std::move(v), h.expand({3, 5}));
      }
      {
        HT h = random(rng, {2, 3, 4}, d);
        T base = upload(ctx, h), v;
        const int32_t perm[] = {2, 0, 1};
        EXPECT_EQ(flame_permute(base, perm, 3, v.out()), FLAME_OK) << flame_last_error_message();
        add("permuted", std::move(v), h.permute({2, 0, 1}));
      }
    }
    return items;
  }

  void expect_loaded(flame_safetensors_t f, const Item& it) {
    SCOPED_TRACE(it.name);
    flame_dtype_t dt = FLAME_DTYPE_F32;
    int64_t shape[FLAME_MAX_DIMS] = {0};
    int32_t nd = -1;
    ASSERT_EQ(flame_safetensors_info(f, it.name.c_str(), &dt, shape, FLAME_MAX_DIMS, &nd), FLAME_OK)
        << flame_last_error_message();
    EXPECT_EQ(dt, it.dtype);
    EXPECT_EQ(Shape(shape, shape + nd), it.shape);
    T got;
    ASSERT_EQ(flame_safetensors_get(f, it.name.c_str(), got.out()), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(shape_of(got), it.shape);
    EXPECT_EQ(dtype_of(got), it.dtype);
    EXPECT_TRUE(is_contiguous(got));
    int32_t rg = -1;
    EXPECT_EQ(flame_tensor_requires_grad(got, &rg), FLAME_OK);
    EXPECT_EQ(rg, 0);
    EXPECT_TRUE(bytes_of(got) == it.expect) << "the bytes differ from the host reference";
  }
};

}  // namespace

TEST_F(Safetensors, RoundTripEveryDtypeAndLayout) {
  HREF_RNG(rng);
  TempDir dir;
  std::vector<Item> items = every_kind(rng);
  ASSERT_EQ(items.size(), 8u * 11u);
  // a tensor that requires grad is saved like any other
  ASSERT_EQ(flame_tensor_set_requires_grad(items[1].t, 1), FLAME_OK) << flame_last_error_message();
  std::vector<std::string> names;
  std::vector<flame_tensor_t> ts;
  size_t data_bytes = 0;
  for (const Item& it : items) {
    names.push_back(it.name);
    ts.push_back(it.t);
    data_bytes += it.expect.size();
  }
  const std::string path = dir.file("all.safetensors");
  ASSERT_EQ(save(ctx, path, names, ts), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(dir.files(), std::vector<std::string>{"all.safetensors"}) << "no temporary file is left";

  // The file as the format and the Python package lay it out: an 8-aligned JSON header, then data.
  Bytes raw = read_file(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | raw[static_cast<size_t>(i)];
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + n + data_bytes);
  EXPECT_EQ(raw[8], '{');
  EXPECT_EQ(raw[8 + n - 1] == ' ' || raw[8 + n - 1] == '}', true);

  File f;
  ASSERT_EQ(flame_safetensors_load(ctx, path.c_str(), f.out()), FLAME_OK) << flame_last_error_message();
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(names_of(f), sorted) << "names are listed in byte order";
  int64_t md = -1;
  ASSERT_EQ(flame_safetensors_metadata_count(f, &md), FLAME_OK);
  EXPECT_EQ(md, 0);
  for (const Item& it : items) expect_loaded(f, it);
}

TEST_F(Safetensors, Metadata) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const float v[3] = {1.5f, -2.0f, 0.25f};
  const int64_t s3[] = {3};
  T t;
  ASSERT_EQ(flame_from_host(ctx, v, sizeof v, s3, 1, FLAME_DTYPE_F32, t.out()), FLAME_OK);
  ASSERT_EQ(save(ctx, path, {"w"}, {t}, {"format", "pt", "\xc3\xa9t\xc3\xa9", "\xc3\xbcn\xc3\xaf \"q\" \\", "empty", ""}),
            FLAME_OK)
      << flame_last_error_message();
  File f;
  ASSERT_EQ(flame_safetensors_load(ctx, path.c_str(), f.out()), FLAME_OK) << flame_last_error_message();
  int64_t n = -1;
  ASSERT_EQ(flame_safetensors_metadata_count(f, &n), FLAME_OK);
  ASSERT_EQ(n, 3);
  const char* expect_keys[] = {"empty", "format", "\xc3\xa9t\xc3\xa9"};  // byte order: 0xC3 sorts last
  for (int64_t i = 0; i < 3; ++i) {
    const char* k = nullptr;
    ASSERT_EQ(flame_safetensors_metadata_key(f, i, &k), FLAME_OK);
    EXPECT_STREQ(k, expect_keys[i]);
  }
  const char* val = "sentinel";
  ASSERT_EQ(flame_safetensors_metadata(f, "format", &val), FLAME_OK);
  EXPECT_STREQ(val, "pt");
  ASSERT_EQ(flame_safetensors_metadata(f, "\xc3\xa9t\xc3\xa9", &val), FLAME_OK);
  EXPECT_STREQ(val, "\xc3\xbcn\xc3\xaf \"q\" \\");
  ASSERT_EQ(flame_safetensors_metadata(f, "empty", &val), FLAME_OK);
  EXPECT_STREQ(val, "");
  val = "sentinel";
  EXPECT_EQ(flame_safetensors_metadata(f, "absent", &val), FLAME_OK) << "an absent key is not an error";
  EXPECT_EQ(val, nullptr);
  const char* k = "sentinel";
  EXPECT_EQ(flame_safetensors_metadata_key(f, 3, &k), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(k, nullptr);
  EXPECT_EQ(flame_safetensors_metadata_key(f, -1, &k), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flame_safetensors_metadata(f, nullptr, &val), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST_F(Safetensors, FileOfZeroTensors) {
  TempDir dir;
  const std::string path = dir.file("empty.safetensors");
  ASSERT_EQ(flame_safetensors_save(ctx, path.c_str(), nullptr, nullptr, 0, nullptr, 0), FLAME_OK)
      << flame_last_error_message();
  Bytes raw = read_file(path);
  const Bytes python = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};  // the package's bytes
  EXPECT_EQ(raw, python);
  File f;
  ASSERT_EQ(flame_safetensors_load(ctx, path.c_str(), f.out()), FLAME_OK) << flame_last_error_message();
  EXPECT_TRUE(names_of(f).empty());
  const char* s = "sentinel";
  EXPECT_EQ(flame_safetensors_name(f, 0, &s), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
}

TEST_F(Safetensors, LargerThanOneCopyPiece) {
  // 5000 x 4000 f32 = 80 MB: more than the 64 MiB piece the saver copies at a time; the transposed
  // view is made contiguous on the device first.
  TempDir dir;
  const int64_t s[] = {5000, 4000};
  T x, xt;
  ASSERT_EQ(flame_randn(ctx, s, 2, FLAME_DTYPE_F32, x.out()), FLAME_OK) << flame_last_error_message();
  ASSERT_EQ(flame_transpose(x, 0, 1, xt.out()), FLAME_OK);
  const std::string path = dir.file("big.safetensors");
  ASSERT_EQ(save(ctx, path, {"x", "xt"}, {x, xt}), FLAME_OK) << flame_last_error_message();
  File f;
  ASSERT_EQ(flame_safetensors_load(ctx, path.c_str(), f.out()), FLAME_OK) << flame_last_error_message();
  for (auto [name, src] : {std::pair<const char*, flame_tensor_t>{"x", x}, {"xt", xt}}) {
    T got;
    ASSERT_EQ(flame_safetensors_get(f, name, got.out()), FLAME_OK) << flame_last_error_message();
    EXPECT_EQ(shape_of(got), shape_of(src));
    EXPECT_TRUE(bytes_of(got) == bytes_of(src)) << name;
  }
}

TEST_F(Safetensors, DtypesAndRanksFlameLacks) {
  // A hand-made file: an F8_E8M0 and an I16 tensor, a 9-d U8 tensor, and an I32 tensor at an odd offset
  // (F8_E4M3 and F8_E5M2 are FLAME dtypes: test_f8.cpp reads them).
  TempDir dir;
  const std::string json =
      "{\"f8\":{\"dtype\":\"F8_E8M0\",\"shape\":[4],\"data_offsets\":[0,4]},"
      "\"i16\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[4,8]},"
      "\"u8_9d\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[8,10]},"
      "\"ok\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[10,18]}}";
  Bytes data = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const int32_t ok[2] = {1, -2};
  data.insert(data.end(), reinterpret_cast<const unsigned char*>(ok), reinterpret_cast<const unsigned char*>(ok) + 8);
  const std::string path = dir.file("other.safetensors");
  write_file(path, raw_file(json, data));
  File f;
  ASSERT_EQ(flame_safetensors_load(ctx, path.c_str(), f.out()), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(names_of(f), (std::vector<std::string>{"f8", "i16", "ok", "u8_9d"})) << "listing shows every tensor";

  flame_dtype_t dt;
  int64_t shape[9];
  int32_t nd = -1;
  EXPECT_EQ(flame_safetensors_info(f, "f8", &dt, shape, 9, &nd), FLAME_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(flame_last_error_message()).find("F8_E8M0"), std::string::npos) << flame_last_error_message();
  EXPECT_EQ(flame_safetensors_info(f, "i16", &dt, shape, 9, &nd), FLAME_ERROR_UNSUPPORTED);
  flame_tensor_t out = sentinel();
  EXPECT_EQ(flame_safetensors_get(f, "f8", &out), FLAME_ERROR_UNSUPPORTED);
  EXPECT_EQ(out, nullptr);

  EXPECT_EQ(flame_safetensors_info(f, "u8_9d", &dt, shape, 8, &nd), FLAME_ERROR_INVALID_ARGUMENT) << "capacity 8 < 9 dims";
  ASSERT_EQ(flame_safetensors_info(f, "u8_9d", &dt, shape, 9, &nd), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(nd, 9);
  EXPECT_EQ(dt, FLAME_DTYPE_U8);
  EXPECT_EQ(shape[8], 2);
  nd = -1;
  ASSERT_EQ(flame_safetensors_info(f, "u8_9d", &dt, nullptr, 0, &nd), FLAME_OK) << "shape NULL asks for ndim only";
  EXPECT_EQ(nd, 9);
  out = sentinel();
  EXPECT_EQ(flame_safetensors_get(f, "u8_9d", &out), FLAME_ERROR_UNSUPPORTED);
  EXPECT_EQ(out, nullptr);

  T got;
  ASSERT_EQ(flame_safetensors_get(f, "ok", got.out()), FLAME_OK) << flame_last_error_message();
  int32_t back[2] = {0, 0};
  ASSERT_EQ(flame_to_host(got, back, sizeof back), FLAME_OK);
  EXPECT_EQ(back[0], 1);
  EXPECT_EQ(back[1], -2);
}

TEST_F(Safetensors, MalformedAndMissingFiles) {
  TempDir dir;
  File f;
  f.h = reinterpret_cast<flame_safetensors_t>(static_cast<uintptr_t>(0x40));  // must be overwritten with NULL
  EXPECT_EQ(flame_safetensors_load(ctx, dir.file("missing").c_str(), &f.h), FLAME_ERROR_IO);
  EXPECT_EQ(f.h, nullptr);
  EXPECT_NE(std::string(flame_last_error_message()).find("missing"), std::string::npos) << flame_last_error_message();
  EXPECT_EQ(flame_safetensors_load(ctx, dir.path.c_str(), f.out()), FLAME_ERROR_IO) << "a directory";
  EXPECT_EQ(f.h, nullptr);

  struct Case {
    const char* name;
    Bytes file;
    const char* expect;
  };
  const std::string good = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  const std::vector<Case> cases = {
      {"empty", {}, "shorter than the 8-byte"},
      {"short-data", raw_file(good, Bytes(4, 0)), "beyond the data region"},
      {"long-data", raw_file(good, Bytes(12, 0)), "after the last tensor"},
      {"huge-header", raw_file("{}", {}), "above the limit"},
      {"not-json", raw_file("{\"a\":", {}), "not valid JSON"},
      {"bad-dtype", raw_file("{\"a\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}", Bytes(8, 0)), "unknown dtype"},
  };
  for (const Case& c : cases) {
    Bytes file = c.file;
    if (std::string(c.name) == "huge-header") file[4] = 1;  // N = 2^32 + 2
    const std::string path = dir.file(c.name);
    write_file(path, file);
    f.h = reinterpret_cast<flame_safetensors_t>(static_cast<uintptr_t>(0x40));
    EXPECT_EQ(flame_safetensors_load(ctx, path.c_str(), &f.h), FLAME_ERROR_INVALID_FORMAT) << c.name;
    EXPECT_EQ(f.h, nullptr) << c.name;
    const std::string msg = flame_last_error_message();
    EXPECT_NE(msg.find(path), std::string::npos) << c.name << ": the message names the file: " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find("flame_safetensors_load"), std::string::npos) << msg;
  }
  EXPECT_EQ(flame_safetensors_load(ctx, nullptr, f.out()), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flame_safetensors_load(ctx, dir.file("x").c_str(), nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST_F(Safetensors, LookupErrors) {
  TempDir dir;
  const std::string path = dir.file("l.safetensors");
  const int64_t s2[] = {2};
  T t;
  ASSERT_EQ(flame_zeros(ctx, s2, 1, FLAME_DTYPE_F16, t.out()), FLAME_OK);
  ASSERT_EQ(save(ctx, path, {"w"}, {t}), FLAME_OK) << flame_last_error_message();
  File f;
  ASSERT_EQ(flame_safetensors_load(ctx, path.c_str(), f.out()), FLAME_OK) << flame_last_error_message();
  flame_tensor_t out = sentinel();
  EXPECT_EQ(flame_safetensors_get(f, "nope", &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_NE(std::string(flame_last_error_message()).find("nope"), std::string::npos) << flame_last_error_message();
  out = sentinel();
  EXPECT_EQ(flame_safetensors_get(f, nullptr, &out), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(flame_safetensors_get(f, "w", nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  flame_dtype_t dt;
  int64_t shape[1];
  int32_t nd = 5;
  EXPECT_EQ(flame_safetensors_info(f, "nope", &dt, shape, 1, &nd), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(nd, 0);
  EXPECT_EQ(flame_safetensors_info(f, "w", &dt, shape, 0, &nd), FLAME_ERROR_INVALID_ARGUMENT) << "capacity below ndim";
  EXPECT_EQ(flame_safetensors_info(f, "w", nullptr, shape, 1, &nd), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flame_safetensors_info(f, "w", &dt, shape, 1, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(flame_safetensors_info(f, "w", &dt, shape, 1, &nd), FLAME_OK);
  EXPECT_EQ(dt, FLAME_DTYPE_F16);
  EXPECT_EQ(nd, 1);
  EXPECT_EQ(shape[0], 2);
  const char* s = "sentinel";
  EXPECT_EQ(flame_safetensors_name(f, 1, &s), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
  EXPECT_EQ(flame_safetensors_name(f, -1, &s), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flame_safetensors_name(f, 0, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flame_safetensors_count(f, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

TEST_F(Safetensors, SaveArgumentErrorsWriteNothing) {
  TempDir dir;
  const std::string path = dir.file("s.safetensors");
  const int64_t s2[] = {2};
  T a, b;
  ASSERT_EQ(flame_ones(ctx, s2, 1, FLAME_DTYPE_F32, a.out()), FLAME_OK);
  ASSERT_EQ(flame_ones(ctx, s2, 1, FLAME_DTYPE_I64, b.out()), FLAME_OK);
  auto expect_fail = [&](flame_status_t want, flame_status_t got, const char* what) {
    EXPECT_EQ(got, want) << what << ": " << flame_status_string(got) << ": " << flame_last_error_message();
    EXPECT_TRUE(dir.files().empty()) << what << ": nothing may be written";
  };
  expect_fail(FLAME_ERROR_INVALID_ARGUMENT, save(ctx, path, {"x", "x"}, {a, b}), "duplicate names");
  expect_fail(FLAME_ERROR_INVALID_ARGUMENT, save(ctx, path, {"__metadata__"}, {a}), "reserved name");
  expect_fail(FLAME_ERROR_INVALID_ARGUMENT, save(ctx, path, {"bad\xff"}, {a}), "invalid UTF-8");
  expect_fail(FLAME_ERROR_INVALID_ARGUMENT, save(ctx, path, {"a"}, {a}, {"k", "1", "k", "2"}), "duplicate keys");
  expect_fail(FLAME_ERROR_INVALID_ARGUMENT, save(ctx, path, {"a"}, {nullptr}), "NULL tensor");
  expect_fail(FLAME_ERROR_INVALID_ARGUMENT, save(nullptr, path, {"a"}, {a}), "NULL ctx");
  const char* one_name[] = {"a"};
  const char* null_name[] = {nullptr};
  flame_tensor_t one[] = {a};
  const char* kv_null[] = {"k", nullptr};
  expect_fail(FLAME_ERROR_INVALID_ARGUMENT, flame_safetensors_save(ctx, path.c_str(), nullptr, one, 1, nullptr, 0), "names NULL");
  expect_fail(FLAME_ERROR_INVALID_ARGUMENT, flame_safetensors_save(ctx, path.c_str(), one_name, nullptr, 1, nullptr, 0),
              "tensors NULL");
  expect_fail(FLAME_ERROR_INVALID_ARGUMENT, flame_safetensors_save(ctx, path.c_str(), null_name, one, 1, nullptr, 0), "a NULL name");
  expect_fail(FLAME_ERROR_INVALID_ARGUMENT, flame_safetensors_save(ctx, path.c_str(), one_name, one, -1, nullptr, 0), "n < 0");
  expect_fail(FLAME_ERROR_INVALID_ARGUMENT, flame_safetensors_save(ctx, path.c_str(), one_name, one, 1, nullptr, 1),
              "metadata_kv NULL");
  expect_fail(FLAME_ERROR_INVALID_ARGUMENT, flame_safetensors_save(ctx, path.c_str(), one_name, one, 1, kv_null, 1),
              "a NULL value");
  expect_fail(FLAME_ERROR_INVALID_ARGUMENT, flame_safetensors_save(ctx, nullptr, one_name, one, 1, nullptr, 0), "path NULL");
  expect_fail(FLAME_ERROR_IO, save(ctx, dir.file("no/such/dir.safetensors"), {"a"}, {a}), "missing directory");

  // a tensor of another context
  bool skip = false;
  std::string why;
  flame_ctx_t other = flame_test_context(&skip, &why);
  ASSERT_NE(other, nullptr) << why;
  T c;
  ASSERT_EQ(flame_ones(other, s2, 1, FLAME_DTYPE_F32, c.out()), FLAME_OK);
  expect_fail(FLAME_ERROR_INVALID_ARGUMENT, save(ctx, path, {"a", "c"}, {a, c}), "another context");
  c = T();
  flame_ctx_destroy(other);

  // a released tensor handle
  flame_tensor_t dead = nullptr;
  ASSERT_EQ(flame_zeros(ctx, s2, 1, FLAME_DTYPE_F32, &dead), FLAME_OK);
  flame_tensor_release(dead);
  expect_fail(FLAME_ERROR_INVALID_HANDLE, save(ctx, path, {"d"}, {dead}), "released tensor");

  // a failed save leaves an existing file as it was
  ASSERT_EQ(save(ctx, path, {"a"}, {a}), FLAME_OK) << flame_last_error_message();
  const Bytes before = read_file(path);
  EXPECT_EQ(save(ctx, path, {"x", "x"}, {a, b}), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(read_file(path), before);
  EXPECT_EQ(dir.files(), std::vector<std::string>{"s.safetensors"});
  // and a successful one replaces it
  ASSERT_EQ(save(ctx, path, {"b"}, {b}), FLAME_OK) << flame_last_error_message();
  File f;
  ASSERT_EQ(flame_safetensors_load(ctx, path.c_str(), f.out()), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(names_of(f), std::vector<std::string>{"b"});
  EXPECT_EQ(dir.files(), std::vector<std::string>{"s.safetensors"});
}

TEST_F(Safetensors, Lifetimes) {
  TempDir dir;
  const std::string path = dir.file("life.safetensors");
  const int64_t v[4] = {10, -20, 30, -40};
  const int64_t s4[] = {4};
  T t;
  ASSERT_EQ(flame_from_host(ctx, v, sizeof v, s4, 1, FLAME_DTYPE_I64, t.out()), FLAME_OK);
  ASSERT_EQ(save(ctx, path, {"v"}, {t}), FLAME_OK) << flame_last_error_message();

  // tensors outlive the handle they came from
  T got;
  {
    File f;
    ASSERT_EQ(flame_safetensors_load(ctx, path.c_str(), f.out()), FLAME_OK) << flame_last_error_message();
    ASSERT_EQ(flame_safetensors_get(f, "v", got.out()), FLAME_OK) << flame_last_error_message();
  }
  int64_t back[4] = {0};
  ASSERT_EQ(flame_to_host(got, back, sizeof back), FLAME_OK);
  EXPECT_EQ(std::memcmp(back, v, sizeof v), 0);

  // a released handle is detected while its context lives
  flame_safetensors_t dead = nullptr;
  ASSERT_EQ(flame_safetensors_load(ctx, path.c_str(), &dead), FLAME_OK);
  flame_safetensors_release(dead);
  int64_t n = 5;
  EXPECT_EQ(flame_safetensors_count(dead, &n), FLAME_ERROR_INVALID_HANDLE);
  EXPECT_EQ(n, 0);
  flame_tensor_t out = sentinel();
  EXPECT_EQ(flame_safetensors_get(dead, "v", &out), FLAME_ERROR_INVALID_HANDLE);
  EXPECT_EQ(out, nullptr);
  flame_safetensors_release(dead);  // again: detected, nothing happens

  // the handle keeps its context alive after flame_ctx_destroy
  bool skip = false;
  std::string why;
  flame_ctx_t other = flame_test_context(&skip, &why);
  ASSERT_NE(other, nullptr) << why;
  flame_safetensors_t f2 = nullptr;
  ASSERT_EQ(flame_safetensors_load(other, path.c_str(), &f2), FLAME_OK) << flame_last_error_message();
  flame_ctx_destroy(other);
  flame_tensor_t on_other = nullptr;
  ASSERT_EQ(flame_safetensors_get(f2, "v", &on_other), FLAME_OK) << flame_last_error_message();
  std::memset(back, 0, sizeof back);
  EXPECT_EQ(flame_to_host(on_other, back, sizeof back), FLAME_OK);
  EXPECT_EQ(std::memcmp(back, v, sizeof v), 0);
  flame_tensor_release(on_other);
  flame_safetensors_release(f2);  // the last reference: the context goes now
}

TEST_F(Safetensors, ConcurrentReadsFromOneHandle) {
  HREF_RNG(rng);
  TempDir dir;
  const std::string path = dir.file("c.safetensors");
  std::vector<HT> hs;
  std::vector<T> ts;
  std::vector<std::string> names;
  std::vector<flame_tensor_t> raw;
  for (int i = 0; i < 6; ++i) {
    flame_dtype_t d = kAllDtypes[i % 8];
    hs.push_back(random(rng, {64, 33}, d));
    ts.push_back(upload(ctx, hs.back()));
    names.push_back("t" + std::to_string(i));
    raw.push_back(ts.back());
  }
  ASSERT_EQ(save(ctx, path, names, raw), FLAME_OK) << flame_last_error_message();
  File f;
  ASSERT_EQ(flame_safetensors_load(ctx, path.c_str(), f.out()), FLAME_OK) << flame_last_error_message();
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < names.size(); ++i) {
          flame_tensor_t got = nullptr;
          if (flame_safetensors_get(f, names[i].c_str(), &got) != FLAME_OK) {
            ++failures[k];
            continue;
          }
          Bytes want = encode(hs[i].values(), hs[i].dtype), have(want.size());
          if (flame_to_host(got, have.data(), have.size()) != FLAME_OK || have != want) ++failures[k];
          flame_tensor_release(got);
          const char* name = nullptr;
          if (flame_safetensors_name(f, static_cast<int64_t>(i), &name) != FLAME_OK || names[i] != name) ++failures[k];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(failures[k], 0) << "thread " << k;
}
