// flame_lora_plan: FLAME's LoRA file plans (src/models/lora_format.h) as JSON, for
// check_lora_formats.py, which builds the files with PyTorch and runs diffusers' loaders on them.
//
//   flame_lora_plan save <model> <kohya|peft> <diffusers|kohya> [mixed|mixedranks] [unit] [modules=a,b,...]
//       model: flux, sdxl, sd15, sd3, clip_l, clip_g, t5 (full-size configs, tests/common/lora_model_configs.h).
//       The modules are the default targets of diffusers' or kohya's trainers (or the listed ones),
//       rank 16 alpha 8 (mixed: ranks 4/8/12, alphas 4/4/16 in turn; mixedranks: ranks 4/8/12, alpha 8;
//       unit: alpha = rank). Prints the model, the modules,
//       the save plan (tensors with their pieces, metadata) and the load plan of the saved keys.
//   flame_lora_plan load <model> <keys.json>
//       keys.json: {"keys": {"<name>": [shape...], ...}, "metadata": {"<key>": "<value>", ...}}.
//       Prints the load plan FLAME makes for the model's component.
// Errors print "error: <message>" on stderr and exit 1.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "core/error.h"
#include "lora_model_configs.h"
#include "models/lora_format.h"

using namespace flame::models;
using flame::models::testing::LoraTestModel;
using nlohmann::json;

namespace {

const char* kind_name(LoraTensorKind k) {
  switch (k) {
    case LoraTensorKind::Down: return "down";
    case LoraTensorKind::Up: return "up";
    case LoraTensorKind::Alpha: return "alpha";
    case LoraTensorKind::Magnitude: return "magnitude";
    case LoraTensorKind::Lokr: return "lokr";
  }
  return "?";
}

json load_plan_json(const LoraLoadPlan& plan) {
  json modules = json::array();
  for (const LoraModuleSource& s : plan.modules)
    modules.push_back({{"module", s.module},
                       {"rank", s.rank},
                       {"alpha", s.alpha},
                       {"alpha_key", s.alpha_key},
                       {"in", s.in_features},
                       {"out", s.out_features},
                       {"down", {{"key", s.down.key}, {"row_begin", s.down.row_begin}, {"rows", s.down.rows}}},
                       {"up", {{"key", s.up.key}, {"row_begin", s.up.row_begin}, {"rows", s.up.rows}, {"swap_halves", s.up.swap_halves}}},
                       {"magnitude", {{"key", s.magnitude.key}, {"row_begin", s.magnitude.row_begin}, {"rows", s.magnitude.rows},
                                      {"swap_halves", s.magnitude.swap_halves}}}});
  return {{"format", plan.format == LoraFileFormat::Kohya ? "kohya" : "peft"},
          {"modules", modules},
          {"other_component_keys", plan.other_component_keys}};
}

json save_plan_json(const LoraSavePlan& plan) {
  json tensors = json::array();
  for (const LoraStoredTensor& t : plan.tensors) {
    json pieces = json::array();
    for (const LoraTensorPiece& p : t.pieces)
      pieces.push_back({{"module", p.module},
                        {"row_begin", p.row_begin},
                        {"rows", p.rows},
                        {"col_begin", p.col_begin},
                        {"cols", p.cols},
                        {"swap_halves", p.swap_halves},
                        {"scale", p.scale},
                        {"adapted_row_norms", p.adapted_row_norms}});
    tensors.push_back({{"key", t.key}, {"shape", t.shape}, {"kind", kind_name(t.kind)}, {"alpha", t.alpha}, {"pieces", pieces}});
  }
  return {{"format", plan.format == LoraFileFormat::Kohya ? "kohya" : "peft"}, {"tensors", tensors}, {"metadata", plan.metadata}};
}

std::vector<LoraModuleShape> chosen_modules(const LoraTestModel& m, LoraTargetConvention conv, bool mixed, bool mixed_ranks,
                                            bool unit, const std::string& listed) {
  const std::vector<LoraCandidate> all = lora_candidate_modules(m.class_name, m.config);
  std::vector<LoraCandidate> picked;
  if (listed.empty()) {
    picked = select_lora_modules(all, default_lora_targets(m.class_name, m.config, conv));
  } else {
    std::stringstream ss(listed);
    for (std::string name; std::getline(ss, name, ',');) {
      bool found = false;
      for (const LoraCandidate& c : all)
        if (c.module == name) {
          picked.push_back(c);
          found = true;
        }
      if (!found) throw std::invalid_argument("no Linear module " + name);
    }
  }
  std::vector<LoraModuleShape> out;
  for (size_t i = 0; i < picked.size(); ++i) {
    const int64_t r = mixed || mixed_ranks ? 4 * static_cast<int64_t>(1 + i % 3) : 16;
    const double a = unit ? static_cast<double>(r) : mixed ? (i % 3 == 2 ? 16.0 : 4.0) : 8.0;
    out.push_back({picked[i].module, r, picked[i].in_features, picked[i].out_features, a});
  }
  return out;
}

int run(int argc, char** argv) {
  if (argc < 3) throw std::invalid_argument("usage: flame_lora_plan save|load <model> ...");
  const std::string mode = argv[1];
  const LoraTestModel m = flame::models::testing::lora_test_model(argv[2]);
  json out = {{"model", m.name}, {"class_name", m.class_name}, {"component", m.component}, {"config", m.config}};
  if (mode == "save") {
    if (argc < 5) throw std::invalid_argument("usage: flame_lora_plan save <model> <kohya|peft> <diffusers|kohya> [mixed|mixedranks] [unit] [modules=...]");
    const std::string fmt = argv[3], conv = argv[4];
    if ((fmt != "kohya" && fmt != "peft") || (conv != "kohya" && conv != "diffusers"))
      throw std::invalid_argument("format must be kohya or peft, targets diffusers or kohya");
    bool mixed = false, mixed_ranks = false, unit = false;
    std::string listed;
    for (int i = 5; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "mixed") mixed = true;
      else if (a == "unit") unit = true;
      else if (a == "mixedranks") mixed_ranks = true;
      else if (a.rfind("modules=", 0) == 0) listed = a.substr(8);
      else throw std::invalid_argument("unknown argument " + a);
    }
    const auto modules = chosen_modules(m, conv == "kohya" ? LoraTargetConvention::Kohya : LoraTargetConvention::DiffusersScripts,
                                        mixed, mixed_ranks, unit, listed);
    json mods = json::array();
    for (const LoraModuleShape& s : modules)
      mods.push_back({{"module", s.module}, {"rank", s.rank}, {"alpha", s.alpha}, {"in", s.in_features}, {"out", s.out_features}});
    const LoraSavePlan plan = plan_lora_save(m.class_name, m.config, m.component, modules,
                                             fmt == "kohya" ? LoraFileFormat::Kohya : LoraFileFormat::Peft);
    std::vector<KeyShape> keys;
    for (const LoraStoredTensor& t : plan.tensors) keys.push_back({t.key, t.shape});
    out["modules"] = mods;
    out["save"] = save_plan_json(plan);
    out["load"] = load_plan_json(plan_lora_load(m.class_name, m.config, m.component, keys, plan.metadata));
  } else if (mode == "load") {
    if (argc != 4) throw std::invalid_argument("usage: flame_lora_plan load <model> <keys.json>");
    std::ifstream f(argv[3]);
    if (!f) throw std::invalid_argument(std::string("cannot open ") + argv[3]);
    const json in = json::parse(f);
    std::vector<KeyShape> keys;
    for (auto it = in.at("keys").begin(); it != in.at("keys").end(); ++it) keys.push_back({it.key(), it.value().get<std::vector<int64_t>>()});
    std::map<std::string, std::string> metadata;
    if (in.contains("metadata"))
      for (auto it = in["metadata"].begin(); it != in["metadata"].end(); ++it) metadata[it.key()] = it.value().get<std::string>();
    out["load"] = load_plan_json(plan_lora_load(m.class_name, m.config, m.component, keys, metadata));
  } else {
    throw std::invalid_argument("mode must be save or load");
  }
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
