// The launch environment (dist/launch_env.h): parsing and every error names its variable; the C
// entry point flame_comm_env_local_rank reads the real environment (set and restored here).
#include <cstdlib>
#include <map>
#include <string>
#include <gtest/gtest.h>
#include "core/error.h"
#include "dist/launch_env.h"
#include "flame.h"

namespace {

using Vars = std::map<std::string, std::string>;

Vars good() {
  return {{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node-a.example"}, {"MASTER_PORT", "29500"}};
}

flame::LaunchEnv read(const Vars& v) {
  return flame::read_launch_env([&](const char* name) -> const char* {
    auto it = v.find(name);
    return it == v.end() ? nullptr : it->second.c_str();
  });
}

// The error of reading v: its status and message (FLAME_OK and "" when it parses).
std::pair<flame_status_t, std::string> error_of(const Vars& v) {
  try {
    read(v);
  } catch (const flame::Error& e) {
    return {e.status(), e.what()};
  }
  return {FLAME_OK, ""};
}

TEST(LaunchEnv, ReadsTheTorchrunVariables) {
  flame::LaunchEnv e = read(good());
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "node-a.example");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.rendezvous_timeout_seconds, 300);
  Vars v = good();
  v["FLAME_RENDEZVOUS_TIMEOUT"] = "2.5";
  v["RANK"] = " 7 ";
  EXPECT_EQ(read(v).rendezvous_timeout_seconds, 2.5);
  EXPECT_EQ(read(v).rank, 7);
}

TEST(LaunchEnv, EachMissingVariableIsNamed) {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    Vars v = good();
    v.erase(name);
    auto [status, message] = error_of(v);
    EXPECT_EQ(status, FLAME_ERROR_INVALID_ARGUMENT) << name;
    EXPECT_NE(message.find(std::string("environment variable ") + name + " is not set"), std::string::npos) << message;
  }
}

TEST(LaunchEnv, MalformedAndOutOfRangeValuesAreNamed) {
  const std::vector<std::pair<std::pair<const char*, const char*>, const char*>> cases = {
      {{"RANK", "8"}, "RANK=8 is not in [0, 7]"},
      {{"RANK", "-1"}, "RANK=-1 is not in [0, 7]"},
      {{"RANK", "2x"}, "RANK=\"2x\" is not a whole decimal number"},
      {{"WORLD_SIZE", "0"}, "WORLD_SIZE=0 is not in [1, "},
      {{"WORLD_SIZE", "99999999999999999999"}, "WORLD_SIZE=\"99999999999999999999\" is not a whole decimal number"},
      {{"LOCAL_RANK", "8"}, "LOCAL_RANK=8 is not in [0, 7]"},
      {{"MASTER_PORT", "0"}, "MASTER_PORT=0 is not in [1, 65535]"},
      {{"MASTER_PORT", "70000"}, "MASTER_PORT=70000 is not in [1, 65535]"},
      {{"MASTER_PORT", "http"}, "MASTER_PORT=\"http\" is not a whole decimal number"},
      {{"MASTER_ADDR", "  "}, "MASTER_ADDR is empty"},
      {{"FLAME_RENDEZVOUS_TIMEOUT", "0"}, "FLAME_RENDEZVOUS_TIMEOUT=\"0\" is not a number of seconds"},
      {{"FLAME_RENDEZVOUS_TIMEOUT", "ten"}, "FLAME_RENDEZVOUS_TIMEOUT=\"ten\" is not a number of seconds"},
      {{"FLAME_RENDEZVOUS_TIMEOUT", "inf"}, "FLAME_RENDEZVOUS_TIMEOUT=\"inf\" is not a number of seconds"},
  };
  for (const auto& c : cases) {
    Vars v = good();
    v[c.first.first] = c.first.second;
    auto [status, message] = error_of(v);
    EXPECT_EQ(status, FLAME_ERROR_INVALID_ARGUMENT) << c.second;
    EXPECT_NE(message.find(c.second), std::string::npos) << "expected \"" << c.second << "\" in: " << message;
  }
}

// Sets the launch variables for one test and restores the previous environment afterwards.
class ProcessEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* n : kNames)
      if (const char* v = std::getenv(n)) saved_[n] = v;
  }
  void TearDown() override {
    for (const char* n : kNames) {
      auto it = saved_.find(n);
      if (it == saved_.end()) unsetenv(n);
      else setenv(n, it->second.c_str(), 1);
    }
  }
  static constexpr const char* kNames[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                           "FLAME_RENDEZVOUS_TIMEOUT"};
  std::map<std::string, std::string> saved_;
};

TEST_F(ProcessEnv, LocalRankThroughTheCApi) {
  for (const auto& [k, v] : good()) setenv(k.c_str(), v.c_str(), 1);
  unsetenv("FLAME_RENDEZVOUS_TIMEOUT");
  int32_t local_rank = -1;
  ASSERT_EQ(flame_comm_env_local_rank(&local_rank), FLAME_OK) << flame_last_error_message();
  EXPECT_EQ(local_rank, 1);
  EXPECT_EQ(flame_comm_env_local_rank(nullptr), FLAME_ERROR_INVALID_ARGUMENT);

  unsetenv("MASTER_PORT");
  local_rank = 5;
  EXPECT_EQ(flame_comm_env_local_rank(&local_rank), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(local_rank, 0);
  EXPECT_NE(std::string(flame_last_error_message()).find("MASTER_PORT is not set"), std::string::npos)
      << flame_last_error_message();
}

TEST_F(ProcessEnv, CreateFromEnvChecksArgumentsFirst) {
  for (const auto& [k, v] : good()) setenv(k.c_str(), v.c_str(), 1);
  flame_comm_t comm = reinterpret_cast<flame_comm_t>(static_cast<uintptr_t>(1));
  EXPECT_EQ(flame_comm_create_from_env(nullptr, nullptr, &comm), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(comm, nullptr);
  EXPECT_EQ(flame_comm_create_from_env(nullptr, nullptr, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
}

}  // namespace
