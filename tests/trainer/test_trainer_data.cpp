// flame-train: buckets (against kohya's lists), caption handling, the folder scan with N_name
// repeats, deterministic batches and load_batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "buckets.h"
#include "captions.h"
#include "dataset.h"
#include "image_writers.h"
#include "random.h"

using namespace flame_train;
using flame_train_test::TempDir;

namespace {

std::vector<std::pair<int, int>> sizes_of(const std::vector<Bucket>& buckets) {
  std::vector<std::pair<int, int>> out;
  for (const auto& b : buckets) out.emplace_back(b.width, b.height);
  return out;
}

}  // namespace

// The expected lists are kohya's make_bucket_resolutions (library/model_util.py) for the same
// arguments, printed by Python.
TEST(TrainerBuckets, MatchKohyaForSd15AndSdxlSettings) {
  BucketOptions sd15;
  sd15.resolution = 512;
  sd15.min_side = 256;
  sd15.max_side = 1024;
  const std::vector<std::pair<int, int>> kohya_512 = {
      {256, 832}, {256, 896}, {256, 960}, {256, 1024}, {320, 704}, {320, 768}, {384, 640}, {448, 576}, {512, 512},
      {576, 448}, {640, 384}, {704, 320}, {768, 320}, {832, 256}, {896, 256}, {960, 256}, {1024, 256}};
  EXPECT_EQ(sizes_of(make_buckets(sd15)), kohya_512);

  BucketOptions sdxl;  // the defaults: 1024, 256..2048, step 64
  const std::vector<std::pair<int, int>> kohya_1024 = {
      {256, 2048},  {320, 2048},  {384, 2048},  {448, 2048}, {512, 1856}, {512, 1920}, {512, 1984}, {512, 2048},
      {576, 1664},  {576, 1728},  {576, 1792},  {640, 1536}, {640, 1600}, {704, 1408}, {704, 1472}, {768, 1280},
      {768, 1344},  {832, 1216},  {896, 1152},  {960, 1088}, {1024, 1024}, {1088, 960}, {1152, 896}, {1216, 832},
      {1280, 768},  {1344, 768},  {1408, 704},  {1472, 704}, {1536, 640}, {1600, 640}, {1664, 576}, {1728, 576},
      {1792, 576},  {1856, 512},  {1920, 512},  {1984, 512}, {2048, 256}, {2048, 320}, {2048, 384}, {2048, 448},
      {2048, 512}};
  EXPECT_EQ(sizes_of(make_buckets(sdxl)), kohya_1024);
  for (const auto& b : make_buckets(sdxl)) {
    EXPECT_EQ(b.width % 64, 0);
    EXPECT_EQ(b.height % 64, 0);
    EXPECT_LE(static_cast<long>(b.width) * b.height, 1024L * 1024L);
  }

  BucketOptions off;
  off.enabled = false;
  off.resolution = 768;
  EXPECT_EQ(sizes_of(make_buckets(off)), (std::vector<std::pair<int, int>>{{768, 768}}));

  // A side under min_side is left out (kohya would add 2048x128 and 128x2048 here).
  BucketOptions small;
  small.resolution = 512;
  small.max_side = 2048;
  for (const auto& b : make_buckets(small)) {
    EXPECT_GE(b.width, 256);
    EXPECT_GE(b.height, 256);
  }
}

TEST(TrainerBuckets, SelectionByAspectRatioAndCoverSize) {
  const std::vector<Bucket> buckets = make_buckets(BucketOptions{});
  auto chosen = [&](int w, int h) { return bucket_name(buckets[select_bucket(buckets, w, h)]); };
  EXPECT_EQ(chosen(1024, 1024), "1024x1024");
  EXPECT_EQ(chosen(3000, 3000), "1024x1024");
  EXPECT_EQ(chosen(1216, 832), "1216x832");   // exact size
  EXPECT_EQ(chosen(1920, 1080), "1344x768");  // 16:9 = 1.778; 1344/768 = 1.75 is nearest
  EXPECT_EQ(chosen(1080, 1920), "768x1344");
  EXPECT_EQ(chosen(4000, 100), "2048x256");   // beyond the widest: the widest

  // Cover: the tighter side matches exactly, the other overhangs (rounded half up).
  CoverSize c = cover_size(1920, 1080, Bucket{1344, 768});
  EXPECT_EQ(c.height, 768);
  EXPECT_EQ(c.width, 1365);  // 1920 * 768 / 1080 = 1365.33
  c = cover_size(1080, 1920, Bucket{768, 1344});
  EXPECT_EQ(c.width, 768);
  EXPECT_EQ(c.height, 1365);
  c = cover_size(500, 500, Bucket{1024, 1024});  // smaller images are enlarged, as in kohya
  EXPECT_EQ(c.width, 1024);
  EXPECT_EQ(c.height, 1024);
}

TEST(TrainerBuckets, EpochBatchesStayInOneBucketAndAreSeeded) {
  BucketMembers members(3);
  uint64_t id = 0;
  for (size_t b = 0; b < 3; ++b)
    for (size_t i = 0; i < 5 + 2 * b; ++i) members[b].push_back(Sample{b * 100 + i, id++});
  const std::vector<Batch> a = epoch_batches(members, 2, 7, 0);
  size_t seen = 0;
  std::set<uint64_t> ids;
  for (const auto& batch : a) {
    ASSERT_FALSE(batch.samples.empty());
    EXPECT_LE(batch.samples.size(), 2u);
    for (const auto& s : batch.samples) {
      EXPECT_EQ(s.image / 100, batch.bucket);  // never mixed
      ids.insert(s.id);
    }
    seen += batch.samples.size();
  }
  EXPECT_EQ(seen, 5u + 7u + 9u);
  EXPECT_EQ(ids.size(), seen);                // every sample once
  EXPECT_EQ(a.size(), 3u + 4u + 5u);          // ceil(5/2) + ceil(7/2) + ceil(9/2)
  auto flat = [](const std::vector<Batch>& v) {
    std::vector<uint64_t> out;
    for (const auto& b : v)
      for (const auto& s : b.samples) out.push_back(s.id);
    return out;
  };
  EXPECT_EQ(flat(epoch_batches(members, 2, 7, 0)), flat(a));  // same seed and epoch: same order
  EXPECT_NE(flat(epoch_batches(members, 2, 7, 1)), flat(a));  // another epoch: another order
  EXPECT_NE(flat(epoch_batches(members, 2, 8, 0)), flat(a));  // another seed: another order
  EXPECT_THROW(epoch_batches(members, 0, 7, 0), std::invalid_argument);
}

TEST(TrainerRandom, StreamsAreFixedAndBounded) {
  RandomStream a(1, RandomPurpose::Crop, 2, 3), b(1, RandomPurpose::Crop, 2, 3), c(1, RandomPurpose::Flip, 2, 3);
  uint64_t x = a.next_u64();
  EXPECT_EQ(x, b.next_u64());
  EXPECT_NE(x, c.next_u64());
  RandomStream r(5, RandomPurpose::BatchOrder, 0, 0);
  std::vector<int> counts(6, 0);
  for (int i = 0; i < 6000; ++i) {
    uint64_t v = r.next_below(6);
    ASSERT_LT(v, 6u);
    ++counts[v];
    double u = r.next_unit();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
  for (int n : counts) EXPECT_NEAR(n, 1000, 150);
  EXPECT_EQ(r.next_below(0), 0u);
}

TEST(TrainerCaptions, SplitTrimsAndDropsEmptyTags) {
  EXPECT_EQ(split_tags(" a cat ,  red hat,, ,smiling ", ","),
            (std::vector<std::string>{"a cat", "red hat", "smiling"}));
  EXPECT_EQ(split_tags("x|y | z", "|"), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_TRUE(split_tags("  ", ",").empty());
}

TEST(TrainerCaptions, ShuffleKeepsTheFirstTagsAndIsSeeded) {
  const std::string caption = "sks person, photo, red hat, smiling, outdoors, bokeh, sunny, 35mm";
  CaptionOptions opt;
  opt.shuffle = true;
  opt.keep_tokens = 2;
  std::set<std::string> variants;
  for (uint64_t item = 0; item < 40; ++item) {
    std::string out = process_caption(caption, opt, 11, 0, item);
    std::vector<std::string> tags = split_tags(out, ",");
    ASSERT_EQ(tags.size(), 8u);
    EXPECT_EQ(tags[0], "sks person");
    EXPECT_EQ(tags[1], "photo");
    std::vector<std::string> sorted = tags, original = split_tags(caption, ",");
    std::sort(sorted.begin(), sorted.end());
    std::sort(original.begin(), original.end());
    EXPECT_EQ(sorted, original);  // a permutation
    EXPECT_EQ(out, process_caption(caption, opt, 11, 0, item));  // deterministic
    variants.insert(out);
  }
  EXPECT_GT(variants.size(), 20u);  // 6! orders: 40 draws give many different ones
  EXPECT_NE(process_caption(caption, opt, 11, 0, 3) + process_caption(caption, opt, 11, 0, 4),
            process_caption(caption, opt, 11, 1, 3) + process_caption(caption, opt, 11, 1, 4));
  // Without shuffling or tag dropout the caption is only trimmed (separators kept as written).
  EXPECT_EQ(process_caption("  a,b ,c ", CaptionOptions{}, 1, 0, 0), "a,b ,c");
  // keep_tokens larger than the tag count: everything fixed.
  opt.keep_tokens = 50;
  EXPECT_EQ(process_caption("a, b, c", opt, 1, 0, 0), "a, b, c");
}

TEST(TrainerCaptions, DropoutRatesAreHonoured) {
  const std::string caption = "a, b, c, d, e, f, g, h, i, j";
  CaptionOptions drop;
  drop.dropout_rate = 0.25;
  int empty = 0;
  for (uint64_t item = 0; item < 4000; ++item) empty += process_caption(caption, drop, 3, 0, item).empty() ? 1 : 0;
  EXPECT_NEAR(empty, 1000, 120);
  drop.dropout_rate = 1.0;
  EXPECT_EQ(process_caption(caption, drop, 3, 0, 0), "");

  CaptionOptions tags;
  tags.tag_dropout_rate = 0.5;
  tags.keep_tokens = 1;
  size_t kept = 0;
  for (uint64_t item = 0; item < 400; ++item) {
    std::vector<std::string> t = split_tags(process_caption(caption, tags, 3, 0, item), ",");
    ASSERT_FALSE(t.empty());
    EXPECT_EQ(t[0], "a");  // fixed tags never drop
    kept += t.size() - 1;
  }
  EXPECT_NEAR(static_cast<double>(kept) / 400, 4.5, 0.4);  // 9 flexible tags, half kept
}

TEST(TrainerDataset, RepeatFolderNames) {
  int n = 0;
  std::string name;
  EXPECT_TRUE(parse_repeat_folder("10_mychar", &n, &name));
  EXPECT_EQ(n, 10);
  EXPECT_EQ(name, "mychar");
  EXPECT_TRUE(parse_repeat_folder("3_a b_c", &n, &name));
  EXPECT_EQ(n, 3);
  EXPECT_EQ(name, "a b_c");
  EXPECT_TRUE(parse_repeat_folder("2_", &n, &name));
  EXPECT_EQ(name, "");
  EXPECT_FALSE(parse_repeat_folder("0_zero", &n, &name));
  EXPECT_FALSE(parse_repeat_folder("_x", &n, &name));
  EXPECT_FALSE(parse_repeat_folder("x_1", &n, &name));
  EXPECT_FALSE(parse_repeat_folder("12a_x", &n, &name));
  EXPECT_FALSE(parse_repeat_folder("plain", &n, &name));
}

TEST(TrainerDataset, ScanFindsImagesCaptionsAndRepeats) {
  TempDir dir;
  const ImageRGB8 wide = flame_train_test::pattern_image(96, 48), tall = flame_train_test::pattern_image(40, 80);
  flame_train_test::write_png(dir.file("b.png"), wide);
  flame_train_test::write_text(dir.file("b.txt"), "\xEF\xBB\xBF  wide image, red \r\nsecond line ignored\n");
  flame_train_test::write_jpeg(dir.file("5_mychar/c.jpg"), tall);
  flame_train_test::write_webp(dir.file("5_mychar/a.webp"), wide);
  flame_train_test::write_text(dir.file("5_mychar/a.txt"), "webp caption");
  flame_train_test::write_png(dir.file("extra/d.PNG"), tall);
  flame_train_test::write_text(dir.file("extra/d.caption"), "other extension");
  flame_train_test::write_text(dir.file("notes.md"), "not an image");
  flame_train_test::write_png(dir.file(".hidden/e.png"), tall);
  flame_train_test::write_png(dir.file("5_mychar/deeper/f.png"), tall);  // two levels down: not read

  DataOptions opt;
  opt.path = dir.path();
  opt.repeats = 2;
  Dataset ds = scan_dataset(opt);
  ASSERT_EQ(ds.images.size(), 4u);
  // Top folder first, then subfolders in sorted order, files sorted in each.
  EXPECT_EQ(ds.images[0].path, dir.file("b.png"));
  EXPECT_EQ(ds.images[0].caption, "wide image, red");
  EXPECT_EQ(ds.images[0].repeats, 2);
  EXPECT_EQ(ds.images[0].size.width, 96);
  EXPECT_EQ(ds.images[1].path, dir.file("5_mychar/a.webp"));
  EXPECT_EQ(ds.images[1].caption, "webp caption");
  EXPECT_EQ(ds.images[1].repeats, 5);
  EXPECT_EQ(ds.images[2].path, dir.file("5_mychar/c.jpg"));
  EXPECT_TRUE(ds.images[2].caption_missing);
  EXPECT_EQ(ds.images[2].caption, "mychar");  // kohya's class token from the folder name
  EXPECT_EQ(ds.images[2].size.height, 80);
  EXPECT_EQ(ds.images[3].path, dir.file("extra/d.PNG"));
  EXPECT_TRUE(ds.images[3].caption_missing);
  EXPECT_EQ(ds.images[3].caption, "");
  EXPECT_EQ(ds.images[3].repeats, 2);
  EXPECT_EQ(ds.sample_count(), 2u + 5u + 5u + 2u);
  EXPECT_EQ(ds.warnings.size(), 2u);

  opt.caption_extension = ".caption";
  Dataset other = scan_dataset(opt);
  EXPECT_EQ(other.images[3].caption, "other extension");
}

TEST(TrainerDataset, ScanCollectsEveryProblem) {
  TempDir dir;
  DataOptions opt;
  opt.path = dir.path();
  try {
    scan_dataset(opt);
    ADD_FAILURE() << "an empty folder was accepted";
  } catch (const DatasetError& e) {
    EXPECT_NE(std::string(e.what()).find("no images"), std::string::npos) << e.what();
  }
  flame_train_test::write_text(dir.file("broken.png"), "not a png");
  flame_train_test::write_png(dir.file("ok.png"), flame_train_test::pattern_image(8, 8));
  flame_train_test::write_text(dir.file("ok.txt"), "bad \xff\xfe utf-8");
  flame_train_test::write_text(dir.file("1_x/cut.jpg"), "\xff\xd8\xff");
  try {
    scan_dataset(opt);
    ADD_FAILURE() << "broken files were accepted";
  } catch (const DatasetError& e) {
    ASSERT_EQ(e.problems().size(), 3u);
    std::string all;
    for (const auto& p : e.problems()) all += p + "\n";
    EXPECT_NE(all.find("broken.png: not a PNG, JPEG or WebP"), std::string::npos) << all;
    EXPECT_NE(all.find("ok.txt: the caption is not valid UTF-8"), std::string::npos) << all;
    EXPECT_NE(all.find("cut.jpg: JPEG"), std::string::npos) << all;
  }
  opt.path = dir.file("missing");
  EXPECT_THROW(scan_dataset(opt), DatasetError);
}

TEST(TrainerDataset, LoadBatchPreparesBucketTensors) {
  TempDir dir;
  // 128x64 (aspect 2) and 64x128 with a small bucket set: resolution 64, sides 32..128, step 32.
  ImageRGB8 wide = flame_train_test::pattern_image(128, 64);
  flame_train_test::write_png(dir.file("3_w/wide.png"), wide);
  flame_train_test::write_text(dir.file("3_w/wide.txt"), "t0, t1, t2, t3");
  flame_train_test::write_png(dir.file("tall.png"), flame_train_test::pattern_image(64, 128));
  DataOptions opt;
  opt.path = dir.path();
  opt.buckets.resolution = 64;
  opt.buckets.min_side = 32;
  opt.buckets.max_side = 128;
  opt.buckets.step = 32;
  opt.flip_aug = true;
  opt.random_crop = true;
  opt.captions.shuffle = true;
  opt.captions.keep_tokens = 1;
  Dataset ds = scan_dataset(opt);
  BucketPlan plan = plan_buckets(ds, opt.buckets);
  ASSERT_EQ(plan.image_bucket.size(), 2u);
  const Bucket wide_bucket = plan.buckets[plan.image_bucket[1]];
  // Buckets 32x96 32x128 64x64 96x32 128x32: aspect 2 is as far from 1 (64x64) as from 3 (96x32);
  // the first in sorted order wins, as with kohya's argmin.
  EXPECT_EQ(bucket_name(wide_bucket), "64x64");
  std::vector<Batch> batches = epoch_batches(plan.members, 4, 9, 0);
  size_t samples = 0, flips = 0;
  for (const Batch& batch : batches) {
    LoadedBatch lb = load_batch(ds, plan, batch, opt, 9, 0);
    const Bucket b = plan.buckets[batch.bucket];
    ASSERT_EQ(lb.width, b.width);
    ASSERT_EQ(lb.height, b.height);
    ASSERT_EQ(lb.pixels.size(), batch.samples.size() * 3 * b.width * b.height);
    for (float v : lb.pixels) {
      ASSERT_GE(v, -1.0f);
      ASSERT_LE(v, 1.0f);
    }
    for (size_t s = 0; s < batch.samples.size(); ++s) {
      const ImageEntry& e = ds.images[batch.samples[s].image];
      EXPECT_EQ(lb.original_sizes[s].width, e.size.width);
      const CoverSize cover = cover_size(e.size.width, e.size.height, b);
      EXPECT_LE(lb.crop_left[s] + b.width, cover.width);
      EXPECT_LE(lb.crop_top[s] + b.height, cover.height);
      if (e.caption_missing) EXPECT_EQ(lb.captions[s], "");
      else EXPECT_EQ(split_tags(lb.captions[s], ",")[0], "t0");
      flips += lb.flipped[s] ? 1 : 0;
    }
    samples += batch.samples.size();
    // Deterministic: the same batch loads to the same floats.
    EXPECT_EQ(load_batch(ds, plan, batch, opt, 9, 0).pixels, lb.pixels);
  }
  EXPECT_EQ(samples, 4u);  // 3 repeats of wide + 1 tall
  EXPECT_LE(flips, 4u);
  EXPECT_NE(describe_plan(ds, plan, 4).find("samples per epoch with repeats: 4"), std::string::npos)
      << describe_plan(ds, plan, 4);
}

TEST(TrainerDataset, CenterCropOfAMatchingImageIsItsResize) {
  // An image of exactly a bucket's size: no resize, no crop; the tensor is the image itself.
  TempDir dir;
  ImageRGB8 img = flame_train_test::pattern_image(64, 64);
  flame_train_test::write_png(dir.file("sq.png"), img);
  DataOptions opt;
  opt.path = dir.path();
  opt.buckets.resolution = 64;
  opt.buckets.min_side = 32;
  opt.buckets.max_side = 128;
  opt.buckets.step = 32;
  Dataset ds = scan_dataset(opt);
  BucketPlan plan = plan_buckets(ds, opt.buckets);
  LoadedBatch lb = load_batch(ds, plan, Batch{plan.image_bucket[0], {Sample{0, 0}}}, opt, 1, 0);
  ASSERT_EQ(lb.width, 64);
  ASSERT_EQ(lb.height, 64);
  EXPECT_EQ(lb.crop_left[0], 0);
  EXPECT_EQ(lb.crop_top[0], 0);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 64; y += 7)
      for (int x = 0; x < 64; x += 5)
        ASSERT_NEAR(lb.pixels[size_t(c) * 64 * 64 + size_t(y) * 64 + x],
                    img.pixels[(size_t(y) * 64 + x) * 3 + c] / 127.5f - 1.0f, 1e-4);
}
