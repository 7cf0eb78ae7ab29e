// The model option "offload" (white-box, src/models/weight_offload.*, parse_model_options): the two
// budget forms, the ring's slot count, how a fraction becomes bytes, and every malformed value as
// FLAME_ERROR_INVALID_ARGUMENT naming the key; without the key offload stays disabled.
#include <gtest/gtest.h>
#include <string>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "models/model.h"

using namespace flame;
using namespace flame::models;

namespace {

flame_status_t parse_status(const char* options, std::string* message = nullptr) {
  try {
    parse_model_options(nlohmann::json::parse(options));
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.status();
  }
  return FLAME_OK;
}

TEST(ModelOffloadOptions, AbsentMeansDisabled) {
  EXPECT_FALSE(parse_model_options(nlohmann::json()).offload.enabled);
  EXPECT_FALSE(parse_model_options(nlohmann::json::parse(R"({"dtype": "bf16"})")).offload.enabled);
  EXPECT_FALSE(parse_model_options(nlohmann::json::parse(R"({"offload": null})")).offload.enabled);
}

TEST(ModelOffloadOptions, BudgetInBytes) {
  const ModelOptions o = parse_model_options(nlohmann::json::parse(R"({"offload": {"budget_bytes": 12000000000}})"));
  EXPECT_TRUE(o.offload.enabled);
  EXPECT_EQ(o.offload.budget_bytes, 12000000000ull);
  EXPECT_EQ(o.offload.slots, 2);
  EXPECT_EQ(o.offload.budget_for(1ull << 40), 12000000000ull);  // independent of the model's size
  EXPECT_TRUE(parse_model_options(nlohmann::json::parse(R"({"offload": {"budget_bytes": 0}})")).offload.enabled);
}

TEST(ModelOffloadOptions, BudgetAsFractionAndSlots) {
  const ModelOptions o = parse_model_options(nlohmann::json::parse(R"({"offload": {"budget_fraction": 0.25, "slots": 3}})"));
  EXPECT_TRUE(o.offload.enabled);
  EXPECT_EQ(o.offload.slots, 3);
  EXPECT_EQ(o.offload.budget_for(1000), 250u);
  EXPECT_EQ(o.offload.budget_for(0), 0u);
  EXPECT_EQ(parse_model_options(nlohmann::json::parse(R"({"offload": {"budget_fraction": 1}})")).offload.budget_for(77), 77u);
}

TEST(ModelOffloadOptions, MalformedValuesNameTheKey) {
  const char* bad[] = {
      R"({"offload": 5})",
      R"({"offload": "yes"})",
      R"({"offload": {}})",
      R"({"offload": {"slots": 3}})",
      R"({"offload": {"budget_bytes": -1}})",
      R"({"offload": {"budget_bytes": 1.5}})",
      R"({"offload": {"budget_bytes": "1G"}})",
      R"({"offload": {"budget_fraction": -0.1}})",
      R"({"offload": {"budget_fraction": 1.5}})",
      R"({"offload": {"budget_fraction": "half"}})",
      R"({"offload": {"budget_bytes": 10, "budget_fraction": 0.5}})",
      R"({"offload": {"budget_bytes": 10, "slots": 1}})",
      R"({"offload": {"budget_bytes": 10, "slots": 65}})",
      R"({"offload": {"budget_bytes": 10, "slots": 2.5}})",
      R"({"offload": {"budgetbytes": 10}})",
  };
  for (const char* b : bad) {
    std::string msg;
    EXPECT_EQ(parse_status(b, &msg), FLAME_ERROR_INVALID_ARGUMENT) << b;
    EXPECT_NE(msg.find("offload"), std::string::npos) << b << ": " << msg;
  }
  std::string msg;
  EXPECT_EQ(parse_status(R"({"offload": {"budget_bytes": 10, "slot": 2}})", &msg), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("offload.slot"), std::string::npos) << msg;
  EXPECT_NE(msg.find("budget_fraction"), std::string::npos) << msg;  // lists the known keys
}

}  // namespace
