// The JSON files of checkpoint folders: a sharded checkpoint's index (*.safetensors.index.json) and
// a diffusers pipeline's model_index.json, parsed and validated without touching the file system
// (checkpoint_files.h opens the files; the fuzz target feeds these parsers arbitrary bytes).
// Every rejection is flame::Error with FLAME_ERROR_INVALID_FORMAT naming `source`; names read from
// the JSON appear in messages through printable(), so a NUL or control byte cannot hide them.
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace flame::models {

constexpr size_t kMaxJsonDepth = 16;  // nesting of objects and arrays a checkpoint's JSON may have

// A component of a diffusers pipeline as model_index.json names it: {"unet": ["diffusers",
// "UNet2DConditionModel"]}.
struct PipelineComponent {
  std::string name, library, class_name;
};

// The weight_map of a sharded checkpoint's index: (tensor name, shard file name) pairs sorted by
// name. Rejects bad JSON (invalid UTF-8 included), duplicate keys at any level, nesting deeper than
// kMaxJsonDepth, a missing or empty "weight_map", a "metadata" that is not an object, a value that
// is not a string, or a shard name that is not a plain file name in the index's folder.
std::vector<std::pair<std::string, std::string>> parse_shard_index(const std::string& json_text,
                                                                   const std::string& source);

// The components model_index.json lists, sorted by name: every key not starting with '_' whose
// value is a [library, class] pair of strings. [null, null] (a pipeline saved without that
// component) and non-array attributes ("force_zeros_for_empty_prompt": true) are skipped. Rejects
// bad JSON, duplicate keys, deep nesting, a top level that is not an object, a malformed pair, or a
// component name that is not a plain folder name.
std::vector<PipelineComponent> parse_model_index(const std::string& json_text, const std::string& source);

// Throws (as above) unless text is one JSON object (config.json).
void check_json_object(const std::string& text, const std::string& source);

// One plain path component: not empty, ".", or "..", and without '/', '\\' or NUL.
bool is_plain_name(const std::string& name);

// name for an error message: control bytes (NUL included) as \xNN.
std::string printable(const std::string& name);

}  // namespace flame::models
