// Where the caching stage's VAE, text encoders and tokenizers come from (flame-train), resolved and
// checked on the CPU before any GPU work.
//
// Encoders per family (diffusers' pipelines): Flux: CLIP-L (text_encoder, tokenizer) and T5-XXL
// (text_encoder_2, tokenizer_2); SDXL: CLIP-L and CLIP-G (text_encoder_2, tokenizer_2); SD3: CLIP-L,
// CLIP-G and T5-XXL (text_encoder_3, tokenizer_3).
// A diffusers folder (model.path a folder): its subfolders vae, text_encoder*, tokenizer*; a config
// key that is set (model.vae, model.text_encoder*, model.tokenizer_dir) overrides the subfolder.
// Single files (model.path a file): model.vae and each encoder's key are required (for an SGM SDXL
// checkpoint that bundles its VAE and text encoders, they may name the same file as model.path),
// and model.tokenizer_dir, a folder with diffusers' tokenizer, tokenizer_2, tokenizer_3 subfolders.
// A CLIP tokenizer folder must hold vocab.json and merges.txt, a T5 one spiece.model.
#pragma once

#include <string>
#include <vector>

namespace flame_train {

struct ConditioningPaths {  // the configuration's model.* keys; empty: not set
  std::string model_path, vae, text_encoder, text_encoder_2, text_encoder_3, tokenizer_dir;
};

enum class TextEncoderKind { ClipL, ClipG, T5 };

struct TextEncoderSource {
  TextEncoderKind kind = TextEncoderKind::ClipL;
  std::string model;      // a file or folder for flame_model_load
  std::string tokenizer;  // the tokenizer's folder
};

struct ConditioningSources {
  std::string vae;
  std::vector<TextEncoderSource> encoders;  // in the pipeline's order
};

// Resolves the sources of family ("flux" | "sdxl" | "sd3"). Every problem (a missing key, path or
// tokenizer file, each named with the key to set) is appended to problems; the result is complete
// only when none was added.
ConditioningSources resolve_conditioning_sources(const std::string& family, const ConditioningPaths& paths,
                                                 std::vector<std::string>& problems);

}  // namespace flame_train
