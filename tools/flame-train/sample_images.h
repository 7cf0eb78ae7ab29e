// flame-train's sample images (issue 37): every sample.every_n_steps steps and at the end of
// training, one image per sample prompt, denoised by the model being trained (sampling.h) and
// decoded by the VAE, laid out in one row and written to
//   <output.dir>/samples/<output.name>-step<NNNNNN>.png
// (a binary .ppm instead in builds without image codecs, FLAME_TRAIN_NO_IMAGES).
//
// Conditioning: the latent cache's sample prompts (training_data.h, load_sample_conditioning; one
// per sample.prompts entry, plus the empty prompt's as the negative for SDXL / SD3); with --demo,
// the demo samples' embeddings in turn (prompt k takes sample k mod count) and zeros as the negative.
// VAE: model.vae, else model.path's "vae" subfolder when model.path is a folder (a single file that
// bundles its VAE names itself in model.vae), loaded in bf16; with --demo a tiny random-init
// AutoencoderKL (f = 8, the family's latent channels, scaling / shift factors) made from a fixed
// seed. The VAE lives on the GPU only during a round: it is loaded (or made) at the start of each
// round and released at its end, so training never holds it; the constructor loads it once to
// check it (channels, factor, the sample size) before the first training step.
// Size: sample.width x sample.height pixels, or the first training sample's size when both are 0.
// Noise: seed sample.seed + k for prompt k, the same in every round, so rounds are comparable.
// The round runs with the model in evaluation mode and grad mode off, and puts both back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config.h"
#include "flame_handles.h"
#include "model_setup.h"
#include "sampling.h"
#include "training_data.h"

namespace flame_train {

// What the VAE's configuration says about decoding.
struct VaeFacts {
  int64_t latent_channels = 0;
  int64_t factor = 8;            // 2^(len(block_out_channels) - 1)
  double scaling_factor = 1.0;
  double shift_factor = 0.0;     // 0 when the configuration has none (SD / SDXL)
};

// Reads them from an AutoencoderKL's complete configuration JSON. Throws std::runtime_error.
VaeFacts vae_facts_from_config(const std::string& config_json);

// The demo's tiny AutoencoderKL configuration for a model with latent_channels channels of family.
std::string demo_vae_config(ModelFamily family, int64_t latent_channels);

// Loads the VAE at source (a file or folder) in bf16, with "component": "vae" where source holds
// several components (component_load_options), and checks that it is an AutoencoderKL (also the
// caching stage's encoder). Throws FlameError or std::runtime_error.
Model load_vae(flame_ctx_t ctx, const std::string& source, const std::string& model_path);

// The sample file's path for step (extension .png, or .ppm in builds without codecs).
std::string sample_image_path(const TrainConfig& config, int64_t step);

class SampleImages {
 public:
  // Gathers the conditioning and checks the VAE and the sample size. samples: the training data
  // (the demo's conditioning, the default size). Throws FlameError or std::runtime_error.
  SampleImages(flame_ctx_t ctx, const TrainConfig& config, const ModelShapes& shapes, bool demo,
               const std::vector<TrainingSample>& samples);

  // One round: writes the row of images for step and returns the file's path. The model is put in
  // evaluation mode with grad mode off and back into training mode afterwards.
  std::string write(flame_model_t model, int64_t step);

 private:
  Model open_vae() const;
  std::vector<float> decode(flame_model_t vae, const Tensor& latent) const;

  flame_ctx_t ctx_;
  const TrainConfig& config_;
  ModelShapes shapes_;
  bool demo_;
  SampleConditioning conditioning_;
  VaeFacts vae_;
  SamplerSettings settings_;
};

}  // namespace flame_train
