// The JSON files of checkpoint folders (see checkpoint_json.h), parsed with nlohmann-json plus the
// checks it leaves out: duplicate keys and unbounded nesting. Kept apart from the file handling so
// that the fuzz target (tests/fuzz/fuzz_checkpoint_index.cpp) needs nothing of the GPU side.
#include "models/checkpoint_json.h"
#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include "core/error.h"

namespace flame::models {
namespace {

using json = nlohmann::json;

// Parses JSON text, rejecting what nlohmann-json would silently accept: duplicate keys (the last
// one would win) and nesting deeper than kMaxJsonDepth. Errors name source.
json parse_json(const std::string& text, const std::string& source) {
  std::vector<std::set<std::string>> open_objects;  // keys seen so far in each open object or array
  auto check = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        FLAME_CHECK(open_objects.size() < kMaxJsonDepth, FLAME_ERROR_INVALID_FORMAT, source,
                    ": JSON nested deeper than ", kMaxJsonDepth, " levels");
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& k = parsed.get_ref<const std::string&>();
        FLAME_CHECK(!open_objects.empty() && open_objects.back().insert(k).second, FLAME_ERROR_INVALID_FORMAT, source,
                    ": the key '", printable(k), "' appears twice in one JSON object");
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(text, check);
  } catch (const json::exception& e) {
    fail(FLAME_ERROR_INVALID_FORMAT, source, ": invalid JSON: ", e.what());
  }
}

}  // namespace

std::string printable(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char ch : s) {
    if (ch < 0x20 || ch == 0x7f) {
      out += "\\x";
      out += hex[ch >> 4];
      out += hex[ch & 15];
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out;
}

bool is_plain_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

void check_json_object(const std::string& text, const std::string& source) {
  FLAME_CHECK(parse_json(text, source).is_object(), FLAME_ERROR_INVALID_FORMAT, source, ": not a JSON object");
}

std::vector<std::pair<std::string, std::string>> parse_shard_index(const std::string& json_text, const std::string& source) {
  const json doc = parse_json(json_text, source);
  FLAME_CHECK(doc.is_object(), FLAME_ERROR_INVALID_FORMAT, source, ": a shard index must be a JSON object");
  const auto map = doc.find("weight_map");
  FLAME_CHECK(map != doc.end(), FLAME_ERROR_INVALID_FORMAT, source, ": no \"weight_map\"");
  FLAME_CHECK(map->is_object(), FLAME_ERROR_INVALID_FORMAT, source, ": \"weight_map\" is not an object");
  FLAME_CHECK(!map->empty(), FLAME_ERROR_INVALID_FORMAT, source, ": \"weight_map\" is empty");
  const auto meta = doc.find("metadata");
  FLAME_CHECK(meta == doc.end() || meta->is_object() || meta->is_null(), FLAME_ERROR_INVALID_FORMAT, source,
              ": \"metadata\" is not an object");
  std::vector<std::pair<std::string, std::string>> pairs;
  pairs.reserve(map->size());
  for (auto it = map->begin(); it != map->end(); ++it) {
    FLAME_CHECK(it.value().is_string(), FLAME_ERROR_INVALID_FORMAT, source, ": the shard of key '", printable(it.key()),
                "' is not a string");
    const std::string& shard = it.value().get_ref<const std::string&>();
    FLAME_CHECK(is_plain_name(shard), FLAME_ERROR_INVALID_FORMAT, source, ": key '", printable(it.key()), "' names the shard '",
                printable(shard), "', which is not a plain file name in the index's folder");
    pairs.emplace_back(it.key(), shard);
  }
  std::sort(pairs.begin(), pairs.end());  // nlohmann's objects iterate sorted already; kept explicit
  return pairs;
}

std::vector<PipelineComponent> parse_model_index(const std::string& json_text, const std::string& source) {
  const json doc = parse_json(json_text, source);
  FLAME_CHECK(doc.is_object(), FLAME_ERROR_INVALID_FORMAT, source, ": model_index.json must be a JSON object");
  std::vector<PipelineComponent> components;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name.empty() || name[0] == '_' || !v.is_array()) continue;  // attributes: _class_name, flags
    FLAME_CHECK(v.size() == 2, FLAME_ERROR_INVALID_FORMAT, source, ": component '", printable(name),
                "' is not a [library, class] pair");
    if (v[0].is_null() && v[1].is_null()) continue;  // saved without this component
    FLAME_CHECK(v[0].is_string() && v[1].is_string(), FLAME_ERROR_INVALID_FORMAT, source, ": component '", printable(name),
                "' is not a [library, class] pair of strings");
    FLAME_CHECK(is_plain_name(name), FLAME_ERROR_INVALID_FORMAT, source, ": component name '", printable(name),
                "' is not a plain folder name");
    components.push_back({name, v[0].get<std::string>(), v[1].get<std::string>()});
  }
  std::sort(components.begin(), components.end(),
            [](const PipelineComponent& a, const PipelineComponent& b) { return a.name < b.name; });
  return components;
}


}  // namespace flame::models
