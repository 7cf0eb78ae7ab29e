// White-box tests (no GPU) of the ZeRO checkpoint format (src/toolkit/zero_checkpoint.*): the
// metadata and tensors of one shard file, and the checks that a set of files is one save whose
// ranges tile every parameter, on in-memory safetensors files.
#include <gtest/gtest.h>
#include <memory>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "io/safetensors.h"
#include "toolkit/zero_checkpoint.h"

using namespace flame;
using json = nlohmann::json;

namespace {

// One parameter of a file under construction: its range, and whether the file holds its state
// (make_file's state slots).
struct ParamSpec {
  std::vector<int64_t> shape;
  int64_t lo, hi;
  bool momentum;
};

// The metadata of rank `rank` of a world-size `world` set of an optimizer kind (SGD by default).
json shard_meta(int64_t rank, int64_t world, const std::vector<ParamSpec>& params, const std::string& kind = "sgd") {
  json files = json::array(), ps = json::array();
  for (int64_t r = 0; r < world; ++r) files.push_back(zero_shard_file_name("ck", r, world));
  for (const ParamSpec& p : params) ps.push_back({{"shape", p.shape}, {"dtype", "f32"}, {"lo", p.lo}, {"hi", p.hi}});
  return {{"version", 1}, {"world", world}, {"rank", rank}, {"kind", kind}, {"step", 3}, {"rounding_rng", nullptr},
          {"lr", json::array({0.5})}, {"files", files}, {"params", ps}};
}

// A file as bytes, its parsed header kept alive for ZeroShardFile.
struct File {
  std::string bytes;
  std::unique_ptr<st::Header> header;
};

// Tensors param.<i> (and state.<i>.<slot> for each of state_slots where the spec holds state) of
// hi - lo f32 elements each, plus `extra` elements in param.0 (to break it) and an optional stray
// tensor.
File make_file(const json& meta, const std::vector<ParamSpec>& params, int64_t extra = 0, bool stray = false,
               const std::vector<std::string>& state_slots = {"momentum_buffer"}) {
  std::vector<st::TensorEntry> entries;
  auto add = [&](const std::string& name, int64_t n) {
    st::TensorEntry e;
    e.name = name;
    e.dtype = FLAME_DTYPE_F32;
    e.shape = {n};
    entries.push_back(e);
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].hi - params[i].lo + (i == 0 ? extra : 0);
    if (n == 0) continue;
    add("param." + std::to_string(i), n);
    if (params[i].momentum)
      for (const std::string& slot : state_slots) add("state." + std::to_string(i) + "." + slot, n);
  }
  if (stray) add("something_else", 1);
  const std::vector<std::pair<std::string, std::string>> metadata = {{kZeroShardKey, meta.dump()}};
  const std::vector<size_t> order = st::layout(entries, metadata);
  File f;
  f.bytes = st::serialize_header(entries, order, metadata);
  uint64_t data = 0;
  for (const st::TensorEntry& e : entries) data += e.bytes();
  f.bytes.append(data, '\0');
  f.header = std::make_unique<st::Header>(
      st::parse(reinterpret_cast<const unsigned char*>(f.bytes.data()), f.bytes.size()));
  return f;
}

ZeroShardFile parse(const File& f, const std::string& name) { return parse_zero_shard_file(*f.header, name); }

// Expects fn to throw flame::Error with status and a message containing `part`.
template <class Fn>
void expect_error(Fn fn, flame_status_t status, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing \"" << part << "\"";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

const std::vector<ParamSpec> kRank0 = {{{2, 3}, 0, 4, true}, {{5}, 0, 0, false}};
const std::vector<ParamSpec> kRank1 = {{{2, 3}, 4, 6, true}, {{5}, 0, 5, true}};

}  // namespace

TEST(ZeroCheckpointFormat, FileNames) {
  EXPECT_EQ(zero_shard_file_name("/tmp/run/ck", 1, 2), "/tmp/run/ck-1-of-2.safetensors");
}

TEST(ZeroCheckpointFormat, ValidSetOfTwoRanks) {
  const File a = make_file(shard_meta(0, 2, kRank0), kRank0), b = make_file(shard_meta(1, 2, kRank1), kRank1);
  const ZeroShardFile fa = parse(a, "a"), fb = parse(b, "b");
  EXPECT_EQ(fa.world, 2);
  EXPECT_EQ(fb.rank, 1);
  EXPECT_EQ(fa.kind, "sgd");
  EXPECT_EQ(fa.step, 3);
  ASSERT_EQ(fa.lrs.size(), 1u);
  EXPECT_EQ(fa.lrs[0], 0.5);
  ASSERT_EQ(fa.params.size(), 2u);
  EXPECT_EQ(fa.params[0].hi, 4);
  ASSERT_EQ(fa.params[0].present.size(), 2u);  // momentum_buffer, master
  EXPECT_TRUE(fa.params[0].present[0]);
  EXPECT_FALSE(fa.params[0].present[1]);
  EXPECT_FALSE(fa.params[1].present[0]);  // empty range: nothing held
  EXPECT_NO_THROW(check_zero_shard_set({fa, fb}));
}

TEST(ZeroCheckpointFormat, ValidSetOfThreeRanksWithRanksThatOwnNothing) {
  // Parameter 0 in three pieces; parameter 1 all on rank 0 (ranks 1 and 2 own none of it and hold
  // no tensor for it, not even its state).
  const std::vector<std::vector<ParamSpec>> ranks = {{{{2, 3}, 0, 2, true}, {{5}, 0, 5, true}},
                                                     {{{2, 3}, 2, 4, true}, {{5}, 5, 5, false}},
                                                     {{{2, 3}, 4, 6, true}, {{5}, 5, 5, false}}};
  std::vector<File> files;
  for (int64_t r = 0; r < 3; ++r) files.push_back(make_file(shard_meta(r, 3, ranks[r]), ranks[r]));
  std::vector<ZeroShardFile> set;
  for (int64_t r = 0; r < 3; ++r) set.push_back(parse(files[r], "r" + std::to_string(r)));
  EXPECT_FALSE(set[2].params[1].present[0]);
  EXPECT_NO_THROW(check_zero_shard_set(set));
  // Rank 1 without its piece of parameter 0's state, while ranks 0 and 2 hold theirs.
  std::vector<ParamSpec> stateless = ranks[1];
  stateless[0].momentum = false;
  const File bare = make_file(shard_meta(1, 3, stateless), stateless);
  set[1] = parse(bare, "bare");
  expect_error([&] { check_zero_shard_set(set); }, FLAME_ERROR_INVALID_FORMAT, "state is in 2 of the 3");
}

TEST(ZeroCheckpointFormat, RefusesBrokenFiles) {
  expect_error([&] { parse(make_file(json::object(), kRank0), "x"); }, FLAME_ERROR_INVALID_FORMAT, "version");
  json bad_kind = shard_meta(0, 2, kRank0);
  bad_kind["kind"] = "rmsprop";
  expect_error([&] { parse(make_file(bad_kind, kRank0), "x"); }, FLAME_ERROR_INVALID_FORMAT, "unknown optimizer kind");
  json bad_rank = shard_meta(0, 2, kRank0);
  bad_rank["rank"] = 2;
  expect_error([&] { parse(make_file(bad_rank, kRank0), "x"); }, FLAME_ERROR_INVALID_FORMAT, "not a valid rank");
  json bad_files = shard_meta(0, 2, kRank0);
  bad_files["files"] = json::array({"../a", "b"});
  expect_error([&] { parse(make_file(bad_files, kRank0), "x"); }, FLAME_ERROR_INVALID_FORMAT, "base names");
  json bad_range = shard_meta(0, 2, kRank0);
  bad_range["params"][0]["hi"] = 7;
  expect_error([&] { parse(make_file(bad_range, kRank0), "x"); }, FLAME_ERROR_INVALID_FORMAT, "is not inside");
  expect_error([&] { parse(make_file(shard_meta(0, 2, kRank0), kRank0, 1), "x"); }, FLAME_ERROR_INVALID_FORMAT,
               "holds 5 elements");
  expect_error([&] { parse(make_file(shard_meta(0, 2, kRank0), kRank0, 0, true), "x"); }, FLAME_ERROR_INVALID_FORMAT,
               "tensors that are no sgd state");
  // A file without the metadata at all.
  File plain = make_file(shard_meta(0, 2, kRank0), kRank0);
  st::Header no_meta = *plain.header;
  no_meta.metadata.clear();
  expect_error([&] { parse_zero_shard_file(no_meta, "x"); }, FLAME_ERROR_INVALID_FORMAT, "not a FLAME ZeRO checkpoint");
}

TEST(ZeroCheckpointFormat, AdamStateIsWholeOrAbsent) {
  // exp_avg and exp_avg_sq together (with or without AMSGrad's max_exp_avg_sq), or no state at all
  // (a save before the first step); anything else would step a moment against a zero partner.
  for (const std::vector<std::string>& slots : std::vector<std::vector<std::string>>{
           {"exp_avg", "exp_avg_sq"}, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, {}}) {
    const File f = make_file(shard_meta(0, 2, kRank0, "adamw"), kRank0, 0, false, slots);
    EXPECT_NO_THROW(parse(f, "ok")) << slots.size() << " slots";
  }
  for (const std::vector<std::string>& slots : std::vector<std::vector<std::string>>{
           {"exp_avg"}, {"exp_avg_sq"}, {"max_exp_avg_sq"}, {"exp_avg", "max_exp_avg_sq"}}) {
    SCOPED_TRACE(slots.front());
    expect_error([&] { parse(make_file(shard_meta(0, 2, kRank0, "adam"), kRank0, 0, false, slots), "x"); },
                 FLAME_ERROR_INVALID_FORMAT, "parameter 0 has an incomplete Adam state");
  }
  // One moment is Lion's and SGD's whole state.
  EXPECT_NO_THROW(parse(make_file(shard_meta(0, 2, kRank0, "lion"), kRank0, 0, false, {"exp_avg"}), "lion"));
}

TEST(ZeroCheckpointFormat, RefusesShapesPastTheElementBoundWithoutOverflow) {
  // Two dimensions of 2^30 and 2^40 multiply past int64: refused as too many elements, not wrapped.
  json big = shard_meta(0, 2, kRank0);
  big["params"][0]["shape"] = json::array({int64_t{1} << 30, int64_t{1} << 40});
  expect_error([&] { parse(make_file(big, kRank0), "x"); }, FLAME_ERROR_INVALID_FORMAT, "too many elements");
  big["params"][0]["shape"] = json::array({int64_t{1} << 40, int64_t{1} << 40, 0});
  expect_error([&] { parse(make_file(big, kRank0), "x"); }, FLAME_ERROR_INVALID_FORMAT, "too many elements");
  // 2^40 elements, the bound itself, are accepted (this file holds 4 of them).
  big["params"][0]["shape"] = json::array({int64_t{1} << 20, int64_t{1} << 20});
  EXPECT_NO_THROW(parse(make_file(big, kRank0), "x"));
}

TEST(ZeroCheckpointFormat, RefusesSetsThatAreNotOneSave) {
  const File a = make_file(shard_meta(0, 2, kRank0), kRank0), b = make_file(shard_meta(1, 2, kRank1), kRank1);
  const ZeroShardFile fa = parse(a, "a"), fb = parse(b, "b");
  expect_error([&] { check_zero_shard_set({fa}); }, FLAME_ERROR_INVALID_FORMAT, "a set of 2 files");
  expect_error([&] { check_zero_shard_set({fb, fa}); }, FLAME_ERROR_INVALID_FORMAT, "expected rank 0");

  // Another world size.
  const File c = make_file(shard_meta(1, 3, kRank1), kRank1);
  expect_error([&] { check_zero_shard_set({fa, parse(c, "c")}); }, FLAME_ERROR_INVALID_FORMAT, "expected rank 1 of 2");
  // Another step.
  json later = shard_meta(1, 2, kRank1);
  later["step"] = 4;
  const File d = make_file(later, kRank1);
  expect_error([&] { check_zero_shard_set({fa, parse(d, "d")}); }, FLAME_ERROR_INVALID_FORMAT, "not of one save");
  // A gap and an overlap in parameter 0's ranges.
  const std::vector<ParamSpec> gap = {{{2, 3}, 5, 6, true}, {{5}, 0, 5, true}};
  const File e = make_file(shard_meta(1, 2, gap), gap);
  expect_error([&] { check_zero_shard_set({fa, parse(e, "e")}); }, FLAME_ERROR_INVALID_FORMAT, "leave a gap");
  const std::vector<ParamSpec> overlap = {{{2, 3}, 3, 6, true}, {{5}, 0, 5, true}};
  const File g = make_file(shard_meta(1, 2, overlap), overlap);
  expect_error([&] { check_zero_shard_set({fa, parse(g, "g")}); }, FLAME_ERROR_INVALID_FORMAT, "overlap");
  // A short tiling of parameter 1.
  const std::vector<ParamSpec> short1 = {{{2, 3}, 4, 6, true}, {{5}, 0, 4, true}};
  const File h = make_file(shard_meta(1, 2, short1), short1);
  expect_error([&] { check_zero_shard_set({fa, parse(h, "h")}); }, FLAME_ERROR_INVALID_FORMAT, "end at element 4 of 5");
  // State in one of the two files that hold parameter 0's elements.
  const std::vector<ParamSpec> no_state = {{{2, 3}, 4, 6, false}, {{5}, 0, 5, true}};
  const File k = make_file(shard_meta(1, 2, no_state), no_state);
  expect_error([&] { check_zero_shard_set({fa, parse(k, "k")}); }, FLAME_ERROR_INVALID_FORMAT, "state is in 1 of the 2");
}
