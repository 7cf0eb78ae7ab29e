// The context logger without a GPU (runtime/log.h): level names, filtering, the stderr format, the
// callback guard, the options' validation, and flame_ctx_create refusing a bad log_level before it
// loads the driver.
#include <gtest/gtest.h>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include "core/error.h"
#include "runtime/log.h"

using namespace flame;

namespace {

struct Recorded {
  std::vector<std::pair<int32_t, std::string>> lines;
};

void record(void* user_data, int32_t level, const char* message) {
  static_cast<Recorded*>(user_data)->lines.emplace_back(level, message);
}

void throwing(void*, int32_t, const char*) { throw std::runtime_error("a C++ callback that throws"); }

}  // namespace

TEST(Log, LevelNamesParseInAnyCase) {
  int32_t level = 0;
  EXPECT_TRUE(parse_log_level("debug", &level));
  EXPECT_EQ(level, FLAME_LOG_DEBUG);
  EXPECT_TRUE(parse_log_level("INFO", &level));
  EXPECT_EQ(level, FLAME_LOG_INFO);
  EXPECT_TRUE(parse_log_level("Warning", &level));
  EXPECT_EQ(level, FLAME_LOG_WARNING);
  EXPECT_TRUE(parse_log_level("warn", &level));
  EXPECT_EQ(level, FLAME_LOG_WARNING);
  EXPECT_TRUE(parse_log_level("off", &level));
  EXPECT_EQ(level, FLAME_LOG_OFF);
  level = 77;
  EXPECT_FALSE(parse_log_level("verbose", &level));
  EXPECT_FALSE(parse_log_level("", &level));
  EXPECT_FALSE(parse_log_level(nullptr, &level));
  EXPECT_EQ(level, 77) << "a failed parse leaves the level alone";
  EXPECT_STREQ(log_level_name(FLAME_LOG_DEBUG), "debug");
  EXPECT_STREQ(log_level_name(FLAME_LOG_WARNING), "warning");
  EXPECT_STREQ(log_level_name(99), "unknown");
}

TEST(Log, StderrLineFormat) {
  EXPECT_EQ(Logger::stderr_line(FLAME_LOG_INFO, "compiling kernels for sm_90"), "flame: compiling kernels for sm_90\n");
  EXPECT_EQ(Logger::stderr_line(FLAME_LOG_DEBUG, "compiled kernel 1"), "flame: compiled kernel 1\n");
  EXPECT_EQ(Logger::stderr_line(FLAME_LOG_WARNING, "cannot write"), "flame: warning: cannot write\n");
}

TEST(Log, DefaultIsInfo) {
  Logger l;
  EXPECT_EQ(l.threshold(), FLAME_LOG_INFO);
  EXPECT_FALSE(l.enabled(FLAME_LOG_DEBUG));
  EXPECT_TRUE(l.enabled(FLAME_LOG_INFO));
  EXPECT_TRUE(l.enabled(FLAME_LOG_WARNING));
  Logger from_null_env = Logger::from_options(nullptr, nullptr, 0, nullptr);
  EXPECT_EQ(from_null_env.threshold(), FLAME_LOG_INFO);
  Logger from_empty_env = Logger::from_options(nullptr, nullptr, 0, "");
  EXPECT_EQ(from_empty_env.threshold(), FLAME_LOG_INFO);
}

TEST(Log, CallbackGetsEnabledLevelsOnly) {
  Recorded r;
  Logger l = Logger::from_options(record, &r, FLAME_LOG_INFO, nullptr);
  l.write(FLAME_LOG_DEBUG, "hidden");
  l.write(FLAME_LOG_INFO, "shown");
  l.write(FLAME_LOG_WARNING, "also shown");
  ASSERT_EQ(r.lines.size(), 2u);
  EXPECT_EQ(r.lines[0].first, FLAME_LOG_INFO);
  EXPECT_EQ(r.lines[0].second, "shown") << "the callback gets the bare message: no prefix, no newline";
  EXPECT_EQ(r.lines[1].first, FLAME_LOG_WARNING);
  EXPECT_EQ(r.lines[1].second, "also shown");
}

TEST(Log, ThresholdsFilter) {
  for (int32_t threshold : {FLAME_LOG_DEBUG, FLAME_LOG_INFO, FLAME_LOG_WARNING, FLAME_LOG_OFF}) {
    Recorded r;
    Logger l = Logger::from_options(record, &r, threshold, nullptr);
    for (int32_t level : {FLAME_LOG_DEBUG, FLAME_LOG_INFO, FLAME_LOG_WARNING}) l.write(level, log_level_name(level));
    size_t expected = threshold == FLAME_LOG_OFF ? 0 : size_t(FLAME_LOG_WARNING - threshold + 1);
    EXPECT_EQ(r.lines.size(), expected) << "threshold " << log_level_name(threshold);
    for (const auto& line : r.lines) EXPECT_GE(line.first, threshold);
  }
}

TEST(Log, OptionLevelWinsOverEnvironment) {
  Recorded r;
  Logger l = Logger::from_options(record, &r, FLAME_LOG_WARNING, "debug");
  EXPECT_EQ(l.threshold(), FLAME_LOG_WARNING);
  Logger e = Logger::from_options(record, &r, 0, "debug");
  EXPECT_EQ(e.threshold(), FLAME_LOG_DEBUG) << "log_level 0 takes $FLAME_LOG";
  Logger off = Logger::from_options(record, &r, 0, "OFF");
  off.write(FLAME_LOG_WARNING, "nothing");
  EXPECT_TRUE(r.lines.empty());
}

TEST(Log, UnknownEnvironmentValueWarnsOnceAndUsesInfo) {
  Recorded r;
  Logger l = Logger::from_options(record, &r, 0, "loud");
  EXPECT_EQ(l.threshold(), FLAME_LOG_INFO);
  ASSERT_EQ(r.lines.size(), 1u) << "reported when the logger is made";
  EXPECT_EQ(r.lines[0].first, FLAME_LOG_WARNING);
  EXPECT_NE(r.lines[0].second.find("FLAME_LOG='loud'"), std::string::npos) << r.lines[0].second;
  l.write(FLAME_LOG_INFO, "next");
  EXPECT_EQ(r.lines.size(), 2u);
}

TEST(Log, BadOptionLevelIsRefused) {
  for (int32_t bad : {-1, FLAME_LOG_OFF + 1, 1000}) {
    try {
      Logger::from_options(nullptr, nullptr, bad, nullptr);
      ADD_FAILURE() << "level " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), FLAME_ERROR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(e.what()).find("level is"), std::string::npos) << e.what();
    }
  }
}

TEST(Log, ThrowingCallbackDoesNotEscape) {
  Logger l = Logger::from_options(throwing, nullptr, FLAME_LOG_DEBUG, nullptr);
  EXPECT_NO_THROW(l.write(FLAME_LOG_INFO, "message"));
}

TEST(Log, StderrSinkWritesOneLine) {
  Logger l = Logger::from_options(nullptr, nullptr, FLAME_LOG_INFO, nullptr);
  testing::internal::CaptureStderr();
  l.write(FLAME_LOG_DEBUG, "not shown");
  l.write(FLAME_LOG_INFO, "compiling kernels for sm_90");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "flame: compiling kernels for sm_90\n");
}

TEST(Log, SetLogNeedsAContext) {
  EXPECT_EQ(flame_ctx_set_log(nullptr, FLAME_LOG_INFO, record, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flame_last_error_message()).find("flame_ctx_set_log"), std::string::npos)
      << flame_last_error_message();
}
