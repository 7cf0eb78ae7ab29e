// Implements conditioning_sources.h with std::filesystem checks only (no GPU, no file reads).
#include "conditioning_sources.h"

#include <filesystem>

namespace flame_train {
namespace {

namespace fs = std::filesystem;

struct EncoderSlot {
  TextEncoderKind kind;
  const char* subfolder;      // diffusers' text encoder subfolder and config key suffix
  const char* tokenizer_dir;  // diffusers' tokenizer subfolder
  const std::string ConditioningPaths::*key;
};

std::vector<EncoderSlot> encoder_slots(const std::string& family) {
  const EncoderSlot clip_l{TextEncoderKind::ClipL, "text_encoder", "tokenizer", &ConditioningPaths::text_encoder};
  if (family == "flux")
    return {clip_l, {TextEncoderKind::T5, "text_encoder_2", "tokenizer_2", &ConditioningPaths::text_encoder_2}};
  const EncoderSlot clip_g{TextEncoderKind::ClipG, "text_encoder_2", "tokenizer_2", &ConditioningPaths::text_encoder_2};
  if (family == "sdxl") return {clip_l, clip_g};
  return {clip_l, clip_g, {TextEncoderKind::T5, "text_encoder_3", "tokenizer_3", &ConditioningPaths::text_encoder_3}};
}

// The explicit key's path, else the diffusers subfolder, else a problem naming the key.
std::string model_source(const std::string& key_value, const std::string& key_name, const std::string& folder,
                         const char* subfolder, std::vector<std::string>& problems) {
  std::string path = key_value;
  if (path.empty() && !folder.empty()) path = (fs::path(folder) / subfolder).string();
  if (path.empty())
    problems.push_back(key_name + " is required: model.path is a single file, so the " + subfolder +
                       " must be named (a file or diffusers folder)");
  else if (!fs::exists(path))
    problems.push_back(key_name + ": " + path + " does not exist" +
                       (key_value.empty() ? " (the diffusers folder has no " + std::string(subfolder) + ")" : ""));
  return path;
}

void check_tokenizer_files(const std::string& folder, TextEncoderKind kind, std::vector<std::string>& problems) {
  const std::vector<const char*> files =
      kind == TextEncoderKind::T5 ? std::vector<const char*>{"spiece.model"}
                                  : std::vector<const char*>{"vocab.json", "merges.txt"};
  if (!fs::is_directory(folder)) {
    problems.push_back("tokenizer folder " + folder + " does not exist");
    return;
  }
  for (const char* file : files)
    if (!fs::exists(fs::path(folder) / file)) problems.push_back("tokenizer folder " + folder + " has no " + file);
}

}  // namespace

ConditioningSources resolve_conditioning_sources(const std::string& family, const ConditioningPaths& paths,
                                                 std::vector<std::string>& problems) {
  ConditioningSources sources;
  if (family != "flux" && family != "sdxl" && family != "sd3") {
    problems.push_back("model family '" + family + "' has no text conditioning (flux, sdxl or sd3)");
    return sources;
  }
  const std::string folder = fs::is_directory(paths.model_path) ? paths.model_path : "";
  sources.vae = model_source(paths.vae, "model.vae", folder, "vae", problems);
  std::string tokenizer_root = paths.tokenizer_dir.empty() ? folder : paths.tokenizer_dir;
  if (tokenizer_root.empty())
    problems.push_back("model.tokenizer_dir is required: model.path is a single file, so name a folder with "
                       "diffusers' tokenizer subfolders (tokenizer, tokenizer_2" +
                       std::string(family == "sd3" ? ", tokenizer_3)" : ")"));
  for (const EncoderSlot& slot : encoder_slots(family)) {
    TextEncoderSource source;
    source.kind = slot.kind;
    source.model = model_source(paths.*slot.key, std::string("model.") + slot.subfolder, folder, slot.subfolder, problems);
    if (!tokenizer_root.empty()) {
      source.tokenizer = (fs::path(tokenizer_root) / slot.tokenizer_dir).string();
      check_tokenizer_files(source.tokenizer, slot.kind, problems);
    }
    sources.encoders.push_back(source);
  }
  return sources;
}

}  // namespace flame_train
