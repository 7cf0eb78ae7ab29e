// safetensors without a GPU (white-box, src/io/): parsing valid headers (metadata, files of zero
// tensors, dtypes FLAME lacks, unknown fields), every class of malformed header rejected with
// FLAME_ERROR_INVALID_FORMAT and a message naming the defect, a random-mutation loop over a valid
// file that must never crash or read out of bounds (files are parsed from exactly-sized heap
// buffers, so an ASan build, -DFLAME_SANITIZE=ON, catches any stray read), the writer's layout and
// bytes against what the Python package writes, and the mmap / atomic-write file helpers.
#include <gtest/gtest.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>
#include "core/error.h"
#include "io/file.h"
#include "io/safetensors.h"

using namespace flame;
using Bytes = std::vector<unsigned char>;

namespace {

// A file: the 8-byte length (of json unless `length` is given), json, then data.
Bytes make_file(const std::string& json, const Bytes& data = {}, uint64_t length = UINT64_MAX) {
  uint64_t n = length == UINT64_MAX ? json.size() : length;
  Bytes f(8);
  for (int i = 0; i < 8; ++i) f[i] = static_cast<unsigned char>(n >> (8 * i));
  f.insert(f.end(), json.begin(), json.end());
  f.insert(f.end(), data.begin(), data.end());
  return f;
}
Bytes zeros(size_t n) { return Bytes(n, 0); }

// Parses f from a heap buffer of exactly f.size() bytes (ASan sees any read past it).
struct Outcome {
  flame_status_t status = FLAME_OK;
  std::string message;
  st::Header header;
};
Outcome parse(const Bytes& f, const st::Limits& limits = st::Limits()) {
  std::unique_ptr<unsigned char[]> buf(new unsigned char[f.size()]);
  if (!f.empty()) std::memcpy(buf.get(), f.data(), f.size());
  Outcome o;
  try {
    o.header = st::parse(buf.get(), f.size(), limits);
  } catch (const Error& e) {
    o.status = e.status();
    o.message = e.what();
  }
  return o;
}

std::string tensor_json(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t b, uint64_t e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(b) +
         "," + std::to_string(e) + "]}";
}

// A valid file: metadata, four tensors in no particular order (one 0-d, one empty), 31 data bytes.
const std::string kValidJson =
    "{\"__metadata__\":{\"format\":\"pt\",\"step\":\"7\"}," + tensor_json("w", "F32", "[2,3]", 0, 24) + "," +
    tensor_json("b", "BF16", "[3]", 24, 30) + "," + tensor_json("m", "BOOL", "[]", 30, 31) + "," +
    tensor_json("e", "I64", "[0,4]", 31, 31) + "}";
Bytes valid_file() {
  Bytes data(31);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 7 + 1);
  return make_file(kValidJson, data);
}

void expect_invariants(const st::Header& h, size_t file_size) {
  EXPECT_EQ(h.data_start + h.data_bytes, file_size);
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const st::TensorEntry& t = h.tensors[i];
    EXPECT_LE(t.begin, t.end);
    EXPECT_LE(t.end, h.data_bytes);
    if (i) EXPECT_LT(h.tensors[i - 1].name, t.name) << "names are sorted and distinct";
    if (t.supported) {
      uint64_t numel = 1;
      for (int64_t s : t.shape) numel *= static_cast<uint64_t>(s);
      EXPECT_EQ(t.bytes(), numel * dtype_size(t.dtype)) << t.name;
    }
  }
}

}  // namespace

// ============================== valid files ==============================

TEST(Safetensors, ParsesTensorsAndMetadata) {
  Bytes f = valid_file();
  Outcome o = parse(f);
  ASSERT_EQ(o.status, FLAME_OK) << o.message;
  const st::Header& h = o.header;
  EXPECT_EQ(h.data_start, 8 + kValidJson.size());
  EXPECT_EQ(h.data_bytes, 31u);
  ASSERT_EQ(h.tensors.size(), 4u);
  EXPECT_EQ(h.tensors[0].name, "b");  // sorted by name
  EXPECT_EQ(h.tensors[1].name, "e");
  EXPECT_EQ(h.tensors[2].name, "m");
  EXPECT_EQ(h.tensors[3].name, "w");
  const st::TensorEntry* w = h.find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(w->supported);
  EXPECT_EQ(w->dtype, FLAME_DTYPE_F32);
  EXPECT_EQ(w->dtype_name, "F32");
  EXPECT_EQ(w->shape, (Shape{2, 3}));
  EXPECT_EQ(w->begin, 0u);
  EXPECT_EQ(w->end, 24u);
  EXPECT_EQ(h.find("b")->dtype, FLAME_DTYPE_BF16);
  EXPECT_EQ(h.find("m")->shape, Shape{});  // 0-d: one element
  EXPECT_EQ(h.find("m")->dtype, FLAME_DTYPE_BOOL);
  EXPECT_EQ(h.find("e")->shape, (Shape{0, 4}));
  EXPECT_EQ(h.find("e")->bytes(), 0u);
  EXPECT_EQ(h.find("x"), nullptr);
  EXPECT_EQ(h.find(""), nullptr);
  ASSERT_EQ(h.metadata.size(), 2u);
  EXPECT_EQ(h.metadata[0].first, "format");
  EXPECT_EQ(h.metadata[1].first, "step");
  ASSERT_NE(h.find_metadata("step"), nullptr);
  EXPECT_EQ(*h.find_metadata("step"), "7");
  EXPECT_EQ(h.find_metadata("nope"), nullptr);
  expect_invariants(h, f.size());
}

TEST(Safetensors, FilesOfZeroTensors) {
  Outcome o = parse(make_file("{}      "));  // what the Python package writes for {}
  ASSERT_EQ(o.status, FLAME_OK) << o.message;
  EXPECT_TRUE(o.header.tensors.empty());
  EXPECT_TRUE(o.header.metadata.empty());
  EXPECT_EQ(o.header.data_bytes, 0u);
  o = parse(make_file("{\"__metadata__\":{\"framework\":\"pt\"}}     "));
  ASSERT_EQ(o.status, FLAME_OK) << o.message;
  EXPECT_TRUE(o.header.tensors.empty());
  ASSERT_EQ(o.header.metadata.size(), 1u);
  EXPECT_EQ(o.header.metadata[0].second, "pt");
  o = parse(make_file("{\"__metadata__\":{}}"));
  ASSERT_EQ(o.status, FLAME_OK) << o.message;
  EXPECT_TRUE(o.header.metadata.empty());
}

TEST(Safetensors, EveryFormatDtypeIsListed) {
  struct D {
    const char* name;
    const char* shape;
    uint64_t bytes;
    int flame;
  };
  const D ds[] = {{"F32", "[3]", 12, FLAME_DTYPE_F32},   {"F16", "[3]", 6, FLAME_DTYPE_F16},   {"BF16", "[3]", 6, FLAME_DTYPE_BF16},
                  {"F64", "[3]", 24, FLAME_DTYPE_F64},   {"I64", "[3]", 24, FLAME_DTYPE_I64},  {"I32", "[3]", 12, FLAME_DTYPE_I32},
                  {"U8", "[3]", 3, FLAME_DTYPE_U8},      {"BOOL", "[3]", 3, FLAME_DTYPE_BOOL}, {"I8", "[3]", 3, -1},
                  {"I16", "[3]", 6, -1},                 {"U16", "[3]", 6, -1},                {"U32", "[3]", 12, -1},
                  {"U64", "[3]", 24, -1},                {"F8_E4M3", "[3]", 3, FLAME_DTYPE_F8_E4M3}, {"F8_E5M2", "[3]", 3, FLAME_DTYPE_F8_E5M2},
                  {"F8_E8M0", "[3]", 3, -1},             {"C64", "[3]", 24, -1},               {"F4", "[4]", 2, -1},
                  {"F6_E2M3", "[4]", 3, -1},             {"F6_E3M2", "[2,2]", 3, -1}};
  std::string json = "{";
  uint64_t at = 0;
  for (const D& d : ds) {
    if (json.size() > 1) json += ",";
    json += tensor_json(std::string("t_") + d.name, d.name, d.shape, at, at + d.bytes);
    at += d.bytes;
  }
  json += "}";
  Bytes f = make_file(json, zeros(at));
  Outcome o = parse(f);
  ASSERT_EQ(o.status, FLAME_OK) << o.message;
  ASSERT_EQ(o.header.tensors.size(), sizeof ds / sizeof ds[0]);
  for (const D& d : ds) {
    const st::TensorEntry* t = o.header.find(std::string("t_") + d.name);
    ASSERT_NE(t, nullptr) << d.name;
    EXPECT_EQ(t->dtype_name, d.name);
    EXPECT_EQ(t->supported, d.flame >= 0) << d.name;
    if (d.flame >= 0) EXPECT_EQ(static_cast<int>(t->dtype), d.flame) << d.name;
    EXPECT_EQ(t->bytes(), d.bytes) << d.name;
  }
  expect_invariants(o.header, f.size());
}

TEST(Safetensors, LenientWhereTheReferenceIs) {
  // Unknown fields are ignored, escapes decode to UTF-8, "-0" is 0, whitespace around the object
  // and between tokens is fine, and the header need not be padded.
  std::string json =
      " { \"a\\u00e9\" : {\"note\":\"x\",\"dtype\":\"U8\",\"extra\":[1,\"x\",null],\"shape\":[-0, 2],"
      "\"data_offsets\":[0,0],\"more\":{\"z\":null}} } ";
  Outcome o = parse(make_file(json));
  ASSERT_EQ(o.status, FLAME_OK) << o.message;
  ASSERT_EQ(o.header.tensors.size(), 1u);
  EXPECT_EQ(o.header.tensors[0].name, "a\xc3\xa9");
  EXPECT_EQ(o.header.tensors[0].shape, (Shape{0, 2}));
  // zero-sized tensors may share an offset; the header may list tensors in any order
  json = "{" + tensor_json("z", "F32", "[4]", 4, 20) + "," + tensor_json("y", "F32", "[0]", 4, 4) + "," +
         tensor_json("x", "F32", "[1]", 0, 4) + "," + tensor_json("w", "F16", "[0,3]", 4, 4) + "}";
  o = parse(make_file(json, zeros(20)));
  ASSERT_EQ(o.status, FLAME_OK) << o.message;
  EXPECT_EQ(o.header.tensors.size(), 4u);
  // a zero in a shape makes any later size harmless
  o = parse(make_file("{" + tensor_json("z", "F64", "[0,9223372036854775807,9223372036854775807]", 0, 0) + "}"));
  EXPECT_EQ(o.status, FLAME_OK) << o.message;
}

// ============================== malformed files ==============================

struct Bad {
  std::string what;
  Bytes file;
  std::string expect;  // a piece of the message
  st::Limits limits = st::Limits();
};

static std::vector<Bad> malformed_cases() {
  const std::string ok_a = tensor_json("a", "F32", "[1]", 0, 4);
  auto one = [](const std::string& body, size_t data = 4) { return make_file("{" + body + "}", zeros(data)); };
  auto field = [](const std::string& fields, size_t data = 4) { return make_file("{\"a\":{" + fields + "}}", zeros(data)); };
  std::vector<Bad> v = {
      // length prefix and size
      {"empty file", {}, "shorter than the 8-byte"},
      {"7 bytes", Bytes(7, 0), "shorter than the 8-byte"},
      {"header length above 100 MB", make_file("{}", {}, 100'000'001), "above the limit"},
      {"header length 2^64-1", make_file("{}", {}, UINT64_MAX - 1), "above the limit"},
      {"header length beyond the file", make_file("{}", {}, 50), "beyond the end of the file"},
      {"header length one past the file", make_file("{}", {}, 3), "beyond the end of the file"},
      {"header length 0", make_file("", {}, 0), "not valid JSON"},
      {"limit lowered", make_file("{}      "), "above the limit", {4, st::kMaxDims, st::kMaxEntries}},
      // UTF-8
      {"0xFF in a name", one("\"a\xff\":{}"), "not valid UTF-8"},
      {"overlong slash", one("\"a\xc0\xaf\":{}"), "not valid UTF-8"},
      {"UTF-16 surrogate", one("\"a\xed\xa0\x80\":{}"), "not valid UTF-8"},
      {"above U+10FFFF", one("\"a\xf4\x90\x80\x80\":{}"), "not valid UTF-8"},
      {"truncated sequence", make_file("{\"a\":1}\xe2\x82"), "not valid UTF-8"},
      {"lone continuation byte", make_file("{\x80}"), "not valid UTF-8"},
      // JSON syntax
      {"truncated JSON", make_file("{\"a\":"), "not valid JSON"},
      {"trailing garbage", make_file("{} x"), "not valid JSON"},
      {"NUL padding", make_file(std::string("{}\0\0", 4)), "NUL byte"},
      {"NUL then more", make_file(std::string("{}\0{\"a\":1}", 10)), "NUL byte"},
      {"two objects", make_file("{}{}"), "not valid JSON"},
      {"invalid escape", one("\"a\\x\":{}"), "not valid JSON"},
      {"lone surrogate escape", one("\"\\ud800\":{}"), "not valid JSON"},
      {"single quotes", make_file("{'a':1}"), "not valid JSON"},
      {"comment", make_file("{/* */}"), "not valid JSON"},
      // JSON types at the top
      {"array at the top", make_file("[]"), "must be a JSON object"},
      {"string at the top", make_file("\"x\""), "must be a JSON object"},
      {"number at the top", make_file("1"), "must be a JSON object"},
      {"null at the top", make_file("null"), "must be a JSON object"},
      {"tensor entry is a number", one("\"a\":1"), "the entry 'a' must be an object"},
      {"tensor entry is an array", one("\"a\":[1]"), "the entry 'a' must be an object"},
      {"tensor entry is null", one("\"a\":null"), "the entry 'a' must be an object"},
      // metadata
      {"__metadata__ is a string", one("\"__metadata__\":\"x\""), "an object of strings"},
      {"__metadata__ value is a number", one("\"__metadata__\":{\"k\":1}"), "must be a string, not a number"},
      {"__metadata__ value is an object", one("\"__metadata__\":{\"k\":{}}"), "must be a string, not an object"},
      {"__metadata__ value is an array", one("\"__metadata__\":{\"k\":[\"x\"]}"), "must be a string, not an array"},
      {"__metadata__ value is null", one("\"__metadata__\":{\"k\":null}"), "must be a string, not null"},
      {"__metadata__ twice", one("\"__metadata__\":{},\"__metadata__\":{}"), "appears twice"},
      {"metadata key twice", one("\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}"), "appears twice"},
      {"NUL in a metadata value", one("\"__metadata__\":{\"k\":\"x\\u0000\"}"), "NUL"},
      {"NUL in a metadata key", one("\"__metadata__\":{\"k\\u0000\":\"x\"}"), "NUL"},
      {"too many metadata entries", one("\"__metadata__\":{\"a\":\"1\",\"b\":\"2\",\"c\":\"3\"}"), "more than 2 entries",
       {st::kMaxHeaderBytes, st::kMaxDims, 2}},
      // names
      {"name twice", one(ok_a + "," + ok_a, 8), "appears twice"},
      {"NUL in a name", one("\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}"), "'a\\x00b' contains a NUL"},
      {"too many tensors",
       one(tensor_json("a", "U8", "[1]", 0, 1) + "," + tensor_json("b", "U8", "[1]", 1, 2) + "," +
           tensor_json("c", "U8", "[1]", 2, 3), 3),
       "more than 2 tensors", {st::kMaxHeaderBytes, st::kMaxDims, 2}},
      // fields
      {"no dtype", field("\"shape\":[1],\"data_offsets\":[0,4]"), "lacks the field 'dtype'"},
      {"no shape", field("\"dtype\":\"F32\",\"data_offsets\":[0,4]"), "lacks the field 'shape'"},
      {"no data_offsets", field("\"dtype\":\"F32\",\"shape\":[1]"), "lacks the field 'data_offsets'"},
      {"empty tensor object", field(""), "lacks the field"},
      {"field twice", field("\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]"), "appears twice"},
      {"dtype is a number", field("\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]"), "dtype must be a string"},
      {"dtype is an array", field("\"dtype\":[\"F32\"],\"shape\":[1],\"data_offsets\":[0,4]"), "dtype must be a string"},
      {"unknown dtype", field("\"dtype\":\"F3\",\"shape\":[1],\"data_offsets\":[0,4]"), "unknown dtype 'F3'"},
      {"lower-case dtype", field("\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]"), "unknown dtype"},
      {"shape is a number", field("\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]"), "shape must be an array"},
      {"shape is an object", field("\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,4]"), "shape must be an array"},
      {"negative dim", field("\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]"), "a negative number"},
      {"fractional dim", field("\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]"), "non-negative integers"},
      {"exponent dim", field("\"dtype\":\"F32\",\"shape\":[1e0],\"data_offsets\":[0,4]"), "non-negative integers"},
      {"string dim", field("\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]"), "not a string"},
      {"boolean dim", field("\"dtype\":\"F32\",\"shape\":[true],\"data_offsets\":[0,4]"), "not a boolean"},
      {"null dim", field("\"dtype\":\"F32\",\"shape\":[null],\"data_offsets\":[0,4]"), "not null"},
      {"nested shape", field("\"dtype\":\"F32\",\"shape\":[[1]],\"data_offsets\":[0,4]"), "nests deeper"},
      {"dim above int64", field("\"dtype\":\"U8\",\"shape\":[9223372036854775808],\"data_offsets\":[0,4]"), "too large"},
      {"dim above uint64", field("\"dtype\":\"U8\",\"shape\":[18446744073709551616],\"data_offsets\":[0,4]"), "out-of-range"},
      {"65 dims", field("\"dtype\":\"F32\",\"shape\":[1" + [] { std::string s; for (int i = 0; i < 64; ++i) s += ",1"; return s; }() +
                        "],\"data_offsets\":[0,4]"), "more than 64 dims"},
      {"dims limit lowered", field("\"dtype\":\"F32\",\"shape\":[1,1,1],\"data_offsets\":[0,4]"), "more than 2 dims",
       {st::kMaxHeaderBytes, 2, st::kMaxEntries}},
      {"one offset", field("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]"), "exactly 2"},
      {"three offsets", field("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,4]"), "exactly 2"},
      {"no offsets", field("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[]"), "exactly 2"},
      {"negative offset", field("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]"), "a negative number"},
      {"fractional offset", field("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]"), "non-negative integers"},
      {"offsets are a string", field("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0,4\""), "data_offsets must be an array"},
      {"offsets are an object", field("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{}"), "data_offsets must be an array"},
      {"unknown field nests too deep", field("\"x\":[[1]],\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]"), "nests deeper"},
      {"unknown object nests too deep", field("\"x\":{\"y\":{}},\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]"),
       "nests deeper"},
      {"deep arrays", make_file(std::string(100000, '[') + std::string(100000, ']')), "must be a JSON object"},
      {"deep objects", make_file("{\"a\":{\"b\":{\"c\":{\"d\":{}}}}}"), "nests deeper"},
      // sizes and ranges
      {"begin after end", one(tensor_json("a", "F32", "[0]", 4, 0), 4), "is after end"},
      {"end beyond the data", one(tensor_json("a", "F32", "[1]", 0, 4), 3), "beyond the data region"},
      {"range far beyond the data", one(tensor_json("a", "F32", "[1]", 18446744073709551608ull, 18446744073709551612ull), 4),
       "beyond the data region"},
      {"byte size too small", one(tensor_json("a", "F32", "[2]", 0, 4), 4), "needs 8"},
      {"byte size too large", one(tensor_json("a", "F32", "[1]", 0, 8), 8), "needs 4"},
      {"0-d with no bytes", one(tensor_json("a", "F32", "[]", 0, 0), 0), "needs 4"},
      {"overlapping ranges", one(tensor_json("a", "F32", "[1]", 0, 4) + "," + tensor_json("b", "F32", "[1]", 2, 6), 6), "overlaps"},
      {"identical ranges", one(tensor_json("a", "F32", "[1]", 0, 4) + "," + tensor_json("b", "F32", "[1]", 0, 4), 4), "overlaps"},
      {"gap between tensors", one(tensor_json("a", "F32", "[1]", 0, 4) + "," + tensor_json("b", "F32", "[1]", 6, 10), 10),
       "gap of 2 bytes"},
      {"gap at the start", one(tensor_json("a", "F32", "[1]", 2, 6), 6), "gap of 2 bytes"},
      {"bytes after the last tensor", one(ok_a, 6), "2 bytes after the last tensor"},
      {"data but no tensors", make_file("{}", zeros(3)), "3 bytes after the last tensor"},
      {"element count overflows", one(tensor_json("a", "U8", "[4294967296,4294967296,4294967296]", 0, 0), 0), "overflows"},
      {"overflow before a zero", one(tensor_json("a", "U8", "[4294967296,4294967296,4294967296,0]", 0, 0), 0), "overflows"},
      {"element count above int64", one(tensor_json("a", "U8", "[3037000500,3037000500]", 0, 0), 0), "too many elements"},
      {"bit count overflows", one(tensor_json("a", "F64", "[2305843009213693952]", 0, 0), 0), "too many elements"},
      {"sub-byte count", one(tensor_json("a", "F4", "[3]", 0, 1), 1), "do not fill whole bytes"},
  };
  return v;
}

TEST(Safetensors, MalformedHeadersAreRejected) {
  for (const Bad& b : malformed_cases()) {
    Outcome o = parse(b.file, b.limits);
    EXPECT_EQ(o.status, FLAME_ERROR_INVALID_FORMAT) << b.what << ": " << o.message;
    EXPECT_NE(o.message.find(b.expect), std::string::npos)
        << b.what << ": the message should contain \"" << b.expect << "\" but is \"" << o.message << "\"";
  }
}

TEST(Safetensors, MessagesCutLongNames) {
  const std::string name(5000, 'n');
  Outcome o = parse(make_file("{" + tensor_json(name, "F32", "[2]", 0, 4) + "}", zeros(4)));
  EXPECT_EQ(o.status, FLAME_ERROR_INVALID_FORMAT);
  EXPECT_LT(o.message.size(), 400u) << o.message;
  EXPECT_NE(o.message.find("(5000 bytes)"), std::string::npos) << o.message;
}

TEST(Safetensors, ValidUtf8) {
  auto ok = [](const std::string& s) { return st::valid_utf8(s.data(), s.size()); };
  EXPECT_TRUE(ok(""));
  EXPECT_TRUE(ok("ascii"));
  EXPECT_TRUE(ok("\xc3\xa9\xe2\x82\xac\xf0\x9f\x94\xa5"));  // e-acute, euro, emoji
  EXPECT_TRUE(ok("\xf4\x8f\xbf\xbf"));                      // U+10FFFF
  EXPECT_TRUE(ok("\xed\x9f\xbf\xee\x80\x80"));              // U+D7FF, U+E000 around the surrogates
  EXPECT_FALSE(ok("\x80"));
  EXPECT_FALSE(ok("\xc3"));
  EXPECT_FALSE(ok("\xc3\x28"));
  EXPECT_FALSE(ok("\xc1\xbf"));          // overlong 2-byte
  EXPECT_FALSE(ok("\xe0\x9f\xbf"));      // overlong 3-byte
  EXPECT_FALSE(ok("\xf0\x8f\xbf\xbf"));  // overlong 4-byte
  EXPECT_FALSE(ok("\xed\xbf\xbf"));      // surrogate
  EXPECT_FALSE(ok("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(ok("\xf8\x88\x80\x80\x80"));
  EXPECT_FALSE(ok("\xff"));
}

// ============================== random mutations ==============================

// Mutates a valid file in ways aimed at the parser: bit flips, structural characters, digits
// changed in place (shapes and offsets), bytes inserted and removed (with the length prefix fixed up
// half the time, to get past it), truncation, a new length prefix, repeated chunks. Every result must
// parse or fail with FLAME_ERROR_INVALID_FORMAT; a result that parses must satisfy the invariants.
TEST(Safetensors, RandomMutationsNeverCrash) {
  const uint64_t seed = std::random_device()();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Bytes base = valid_file();
  const std::string interesting = "\"{}[],:-0123456789 \\eE.+tfn";
  const unsigned char extra[] = {0x00, 0x7F, 0x80, 0xBF, 0xC0, 0xC3, 0xE2, 0xED, 0xF0, 0xF4, 0xFF};
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  auto any_byte = [&]() -> unsigned char {
    return rng() % 4 ? static_cast<unsigned char>(interesting[pick(interesting.size())]) : extra[pick(sizeof extra)];
  };
  auto fix_length = [](Bytes& f, size_t header) {
    for (int i = 0; i < 8 && static_cast<size_t>(i) < f.size(); ++i) f[i] = static_cast<unsigned char>(header >> (8 * i));
  };
  int ok = 0, rejected = 0;
  const int iterations = 40000;
  for (int it = 0; it < iterations; ++it) {
    Bytes f = base;
    size_t header = kValidJson.size();
    const int n_mut = 1 + static_cast<int>(pick(4));
    for (int m = 0; m < n_mut; ++m) {
      switch (pick(9)) {
        case 0:  // flip a bit anywhere
          if (!f.empty()) f[pick(f.size())] ^= static_cast<unsigned char>(1u << pick(8));
          break;
        case 1:  // a structural or odd byte in the header
          if (f.size() > 8) f[8 + pick(std::min(header, f.size() - 8))] = any_byte();
          break;
        case 2: {  // change a digit of the header to another digit
          std::vector<size_t> digits;
          for (size_t i = 8; i < std::min(f.size(), 8 + header); ++i)
            if (f[i] >= '0' && f[i] <= '9') digits.push_back(i);
          if (!digits.empty()) f[digits[pick(digits.size())]] = static_cast<unsigned char>('0' + pick(10));
          break;
        }
        case 3: {  // insert a byte into the header
          size_t at = 8 + pick(header + 1);
          if (at <= f.size()) {
            f.insert(f.begin() + static_cast<std::ptrdiff_t>(at), any_byte());
            ++header;
            if (rng() & 1) fix_length(f, header);
          }
          break;
        }
        case 4: {  // remove a byte of the header
          if (header > 0 && f.size() > 8) {
            size_t at = 8 + pick(std::min(header, f.size() - 8));
            f.erase(f.begin() + static_cast<std::ptrdiff_t>(at));
            --header;
            if (rng() & 1) fix_length(f, header);
          }
          break;
        }
        case 5:  // truncate
          f.resize(pick(f.size() + 1));
          break;
        case 6: {  // a new length prefix near the real one, or anything
          uint64_t n = rng() % 3 ? header + pick(33) - 16 : rng();
          fix_length(f, n);
          break;
        }
        case 7: {  // repeat a chunk of the header in place
          if (f.size() > 9 && header > 2) {
            size_t a = 8 + pick(std::min(header, f.size() - 8)), len = 1 + pick(12);
            len = std::min(len, f.size() - a);
            Bytes chunk(f.begin() + static_cast<std::ptrdiff_t>(a), f.begin() + static_cast<std::ptrdiff_t>(a + len));
            f.insert(f.begin() + static_cast<std::ptrdiff_t>(a), chunk.begin(), chunk.end());
            header += len;
            if (rng() & 1) fix_length(f, header);
          }
          break;
        }
        default:  // grow or shrink the data region
          if (rng() & 1) f.push_back(static_cast<unsigned char>(rng()));
          else if (f.size() > 8 + header) f.pop_back();
          break;
      }
    }
    Outcome o = parse(f);
    if (o.status == FLAME_OK) {
      ++ok;
      expect_invariants(o.header, f.size());
    } else {
      ++rejected;
      ASSERT_EQ(o.status, FLAME_ERROR_INVALID_FORMAT) << o.message;
      ASSERT_FALSE(o.message.empty());
    }
  }
  EXPECT_GT(rejected, iterations / 2) << "the mutations should mostly break the file";
  EXPECT_GT(ok, 0) << "some mutations (data bytes, metadata text) leave a valid file";
}

// ============================== writing ==============================

namespace {

st::TensorEntry entry(const std::string& name, DType d, Shape s) {
  st::TensorEntry e;
  e.name = name;
  e.dtype = d;
  e.shape = std::move(s);
  return e;
}

std::string header_of(const std::vector<st::TensorEntry>& ts, const std::vector<std::pair<std::string, std::string>>& md) {
  std::vector<st::TensorEntry> copy = ts;
  auto order = st::layout(copy, md);
  return st::serialize_header(copy, order, md);
}

std::string prefixed(const std::string& json) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  return out + json;
}

}  // namespace

TEST(Safetensors, HeaderBytesMatchThePythonPackage) {
  // The byte strings of the reference implementation's own serialisation tests.
  EXPECT_EQ(header_of({}, {}), prefixed("{}      "));
  EXPECT_EQ(header_of({}, {{"framework", "pt"}}), prefixed("{\"__metadata__\":{\"framework\":\"pt\"}}     "));
  EXPECT_EQ(header_of({entry("attn.0", FLAME_DTYPE_F32, {1, 2, 3})}, {}),
            prefixed("{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}"));
  EXPECT_EQ(header_of({entry("attn0", FLAME_DTYPE_F32, {1, 1, 2, 3})}, {}),
            prefixed("{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}       "));
  // non-ASCII stays raw UTF-8; a 0-d tensor has shape []
  EXPECT_EQ(header_of({entry("\xc3\xa9", FLAME_DTYPE_BOOL, {})}, {}),
            prefixed("{\"\xc3\xa9\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[0,1]}} "));
}

TEST(Safetensors, LayoutOrderAndAlignment) {
  std::vector<st::TensorEntry> ts = {entry("b", FLAME_DTYPE_F32, {2}),  entry("a", FLAME_DTYPE_F16, {3}),
                                     entry("c", FLAME_DTYPE_F64, {1}),  entry("z", FLAME_DTYPE_BOOL, {5}),
                                     entry("y", FLAME_DTYPE_I64, {0}),  entry("d", FLAME_DTYPE_BF16, {2, 1}),
                                     entry("u", FLAME_DTYPE_U8, {3}),   entry("i", FLAME_DTYPE_I32, {})};
  auto order = st::layout(ts, {});
  std::vector<std::string> names;
  for (size_t i : order) names.push_back(ts[i].name);
  // the Python package's order: I64, F64, F32, I32, BF16, F16, U8, BOOL, then by name
  EXPECT_EQ(names, (std::vector<std::string>{"y", "c", "b", "i", "d", "a", "u", "z"}));
  uint64_t at = 0;
  for (size_t i : order) {
    EXPECT_EQ(ts[i].begin, at) << ts[i].name;
    EXPECT_EQ(ts[i].begin % dtype_size(ts[i].dtype), 0u) << ts[i].name << " is aligned to its element size";
    at = ts[i].end;
  }
  EXPECT_EQ(ts[2].end - ts[2].begin, 8u);
  EXPECT_EQ(ts[4].end - ts[4].begin, 0u);
  EXPECT_EQ(ts[0].dtype_name, "F32");
  EXPECT_EQ(ts[5].dtype_name, "BF16");
}

TEST(Safetensors, LayoutRejectsBadNames) {
  auto status = [](std::vector<st::TensorEntry> ts, std::vector<std::pair<std::string, std::string>> md) {
    try {
      st::layout(ts, md);
      return FLAME_OK;
    } catch (const Error& e) {
      return e.status();
    }
  };
  EXPECT_EQ(status({entry("a", FLAME_DTYPE_F32, {1}), entry("a", FLAME_DTYPE_U8, {1})}, {}), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status({entry("a", FLAME_DTYPE_F32, {1}), entry("a", FLAME_DTYPE_F32, {2})}, {}), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status({entry("__metadata__", FLAME_DTYPE_F32, {1})}, {}), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status({entry("bad\xff", FLAME_DTYPE_F32, {1})}, {}), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status({}, {{"k", "1"}, {"k", "2"}}), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status({}, {{"k", "\xc3"}}), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status({}, {{"\xc3", "v"}}), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(status({entry("", FLAME_DTYPE_F32, {1})}, {{"", ""}}), FLAME_OK) << "empty names and keys are allowed";
}

TEST(Safetensors, WrittenHeadersParseBack) {
  const uint64_t seed = std::random_device()();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const DType dtypes[] = {FLAME_DTYPE_F32, FLAME_DTYPE_F16, FLAME_DTYPE_BF16, FLAME_DTYPE_F64,
                          FLAME_DTYPE_I32, FLAME_DTYPE_I64, FLAME_DTYPE_U8,   FLAME_DTYPE_BOOL,
                          FLAME_DTYPE_F8_E4M3, FLAME_DTYPE_F8_E5M2};
  for (int round = 0; round < 200; ++round) {
    std::vector<st::TensorEntry> ts;
    const int n = static_cast<int>(rng() % 7);
    for (int i = 0; i < n; ++i) {
      Shape s(rng() % 4);
      for (auto& d : s) d = static_cast<int64_t>(rng() % 5);
      ts.push_back(entry("t" + std::to_string(rng() % 1000) + "_" + std::to_string(i), dtypes[rng() % (sizeof dtypes / sizeof dtypes[0])], s));
    }
    std::vector<std::pair<std::string, std::string>> md;
    if (rng() & 1) md = {{"format", "pt"}, {"\xe2\x82\xac", "quote \" backslash \\ newline \n"}};
    auto order = st::layout(ts, md);
    std::string head = st::serialize_header(ts, order, md);
    ASSERT_EQ(head.size() % 8, 0u);
    Bytes f(head.begin(), head.end());
    uint64_t data = ts.empty() ? 0 : ts[order.back()].end;
    for (uint64_t i = 0; i < data; ++i) f.push_back(static_cast<unsigned char>(rng()));
    Outcome o = parse(f);
    ASSERT_EQ(o.status, FLAME_OK) << o.message;
    ASSERT_EQ(o.header.tensors.size(), ts.size());
    EXPECT_EQ(o.header.data_start % 8, 0u);
    for (const st::TensorEntry& t : ts) {
      const st::TensorEntry* got = o.header.find(t.name);
      ASSERT_NE(got, nullptr) << t.name;
      EXPECT_EQ(got->dtype, t.dtype);
      EXPECT_EQ(got->shape, t.shape);
      EXPECT_EQ(got->begin, t.begin);
      EXPECT_EQ(got->end, t.end);
    }
    ASSERT_EQ(o.header.metadata.size(), md.size());
    for (const auto& kv : md) {
      ASSERT_NE(o.header.find_metadata(kv.first), nullptr);
      EXPECT_EQ(*o.header.find_metadata(kv.first), kv.second);
    }
  }
}

// ============================== files ==============================

namespace {

std::string temp_dir() {
  char tmpl[] = "/tmp/flame-st-test-XXXXXX";
  char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? std::string(d) : std::string("/tmp");
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> v;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) v.push_back(e->d_name);
    closedir(d);
  }
  std::sort(v.begin(), v.end());
  return v;
}

Bytes read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

flame_status_t status_of(const std::function<void()>& f, std::string* msg = nullptr) {
  try {
    f();
    return FLAME_OK;
  } catch (const Error& e) {
    if (msg) *msg = e.what();
    return e.status();
  }
}

}  // namespace

TEST(SafetensorsFiles, AtomicWriteThenMap) {
  const std::string dir = temp_dir(), path = dir + "/model.safetensors";
  std::vector<st::TensorEntry> ts = {entry("w", FLAME_DTYPE_F32, {2, 2}), entry("b", FLAME_DTYPE_U8, {3})};
  auto order = st::layout(ts, {{"k", "v"}});
  std::string head = st::serialize_header(ts, order, {{"k", "v"}});
  const unsigned char w[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, b[3] = {7, 8, 9};
  {
    io::AtomicFileWriter out(path);
    out.write(head.data(), head.size());
    out.write(w, sizeof w);  // F32 first: the layout order
    out.write(b, sizeof b);
    EXPECT_EQ(list_dir(dir).size(), 1u) << "only the temporary file exists before commit";
    out.commit();
  }
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"model.safetensors"}) << "no temporary file is left";
  io::MappedFile m(path);
  ASSERT_EQ(m.size(), head.size() + 19);
  st::Header h = st::parse(m.data(), m.size());
  ASSERT_NE(h.find("w"), nullptr);
  EXPECT_EQ(std::memcmp(m.data() + h.data_start + h.find("w")->begin, w, 16), 0);
  EXPECT_EQ(std::memcmp(m.data() + h.data_start + h.find("b")->begin, b, 3), 0);
  EXPECT_EQ(*h.find_metadata("k"), "v");
}

TEST(SafetensorsFiles, UncommittedWriteLeavesTheOldFile) {
  const std::string dir = temp_dir(), path = dir + "/f.safetensors";
  { std::ofstream(path) << "old"; }
  {
    io::AtomicFileWriter out(path);
    out.write("new content", 11);
    // destroyed without commit(), as when a copy fails half way
  }
  EXPECT_EQ(read_all(path), (Bytes{'o', 'l', 'd'}));
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"f.safetensors"});
  {
    io::AtomicFileWriter out(path);
    out.write("new", 3);
    out.commit();
  }
  EXPECT_EQ(read_all(path), (Bytes{'n', 'e', 'w'}));
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"f.safetensors"});
}

TEST(SafetensorsFiles, IoErrors) {
  const std::string dir = temp_dir();
  std::string msg;
  EXPECT_EQ(status_of([&] { io::MappedFile m(dir + "/missing.safetensors"); }, &msg), FLAME_ERROR_IO);
  EXPECT_NE(msg.find("missing.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;
  EXPECT_EQ(status_of([&] { io::MappedFile m(dir); }, &msg), FLAME_ERROR_IO);
  EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
  EXPECT_EQ(status_of([&] { io::AtomicFileWriter w(dir + "/no/such/dir/x.safetensors"); }, &msg), FLAME_ERROR_IO);
  EXPECT_NE(msg.find("no/such/dir"), std::string::npos) << msg;
  EXPECT_EQ(status_of([&] { io::AtomicFileWriter w(""); }), FLAME_ERROR_IO);
  // renaming over a directory fails at commit and removes the temporary file
  const std::string sub = dir + "/subdir";
  ASSERT_EQ(mkdir(sub.c_str(), 0700), 0);
  ASSERT_EQ(mkdir((sub + "/inner").c_str(), 0700), 0);
  EXPECT_EQ(status_of([&] {
              io::AtomicFileWriter w(sub);
              w.write("x", 1);
              w.commit();
            }, &msg),
            FLAME_ERROR_IO);
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"subdir"}) << msg;
  // an empty file maps to nothing and is not a safetensors file
  { std::ofstream(dir + "/empty"); }
  io::MappedFile empty(dir + "/empty");
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(status_of([&] { st::parse(empty.data(), empty.size()); }), FLAME_ERROR_INVALID_FORMAT);
}
