// flame_model_run: runs one forward (and backward) pass of a FLAME model through the public C ABI,
// for tests/models/check_model_parity.py to compare with the real diffusers / transformers class on
// the GPU machine. Everything goes through flame.h, so the tool also exercises the model ABI.
//
//   flame_model_run --arch CLASS --config CONFIG.json --weights W.safetensors
//                   --inputs IN.safetensors --out OUT.safetensors
//                   [--grads G.safetensors] [--dtype f32|bf16|f16] [--checkpoint N]
//   flame_model_run --load PATH [--options JSON] --inputs ... (the same from here on)
//   LoRA (tests/models/check_lora_conformance.py, check_dora_parity.py): [--lora-load L.safetensors
//                   [--lora-options JSON]] [--lora-save-kohya K] [--lora-save-peft P]
//
// Weights load strictly (every parameter, no extra tensor) into flame_model_params' list; with
// --load, flame_model_load reads PATH (a file or folder as users have them) instead. Inputs
// are every tensor of IN; float inputs require grad. With --grads, the loss is the sum over every
// tensor "<output>" of G of sum(output * G[output]), and backward runs once. OUT receives the
// outputs named in G (or all outputs without --grads) as "out.<name>", and with --grads every
// parameter gradient as "grad.<param>" and every float input gradient as "grad_input.<name>".
// --lora-load reads a LoRA file (any format flame_model_load_lora knows) as the adapter "default"
// (load options --lora-options, default {"trainable": true}); its gradients are written as "lora_grad.<module>.lora_A.weight" / "...lora_B.weight".
// --lora-save-kohya / --lora-save-peft write that adapter back with flame_model_save_lora.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include "flame.h"

namespace {

void check(flame_status_t s, const char* what) {
  if (s == FLAME_OK) return;
  std::fprintf(stderr, "flame_model_run: %s failed: %s: %s\n", what, flame_status_string(s), flame_last_error_message());
  std::exit(1);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "flame_model_run: cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Args {
  std::string arch, config, weights, inputs, out, grads, dtype = "f32", load, options;
  std::string lora_load, lora_options, lora_save_kohya, lora_save_peft;
  long checkpoint = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "flame_model_run: %s needs a value\n", k.c_str());
      std::exit(1);
    }
    std::string v = argv[++i];
    if (k == "--arch") a.arch = v;
    else if (k == "--config") a.config = v;
    else if (k == "--weights") a.weights = v;
    else if (k == "--inputs") a.inputs = v;
    else if (k == "--out") a.out = v;
    else if (k == "--grads") a.grads = v;
    else if (k == "--dtype") a.dtype = v;
    else if (k == "--load") a.load = v;
    else if (k == "--options") a.options = v;
    else if (k == "--lora-load") a.lora_load = v;
    else if (k == "--lora-options") a.lora_options = v;
    else if (k == "--lora-save-kohya") a.lora_save_kohya = v;
    else if (k == "--lora-save-peft") a.lora_save_peft = v;
    else if (k == "--checkpoint") a.checkpoint = std::strtol(v.c_str(), nullptr, 10);
    else {
      std::fprintf(stderr, "flame_model_run: unknown argument %s\n", k.c_str());
      std::exit(1);
    }
  }
  if ((a.load.empty() && (a.arch.empty() || a.weights.empty())) || a.inputs.empty() || a.out.empty()) {
    std::fprintf(stderr, "usage: flame_model_run --arch CLASS [--config C.json] --weights W.safetensors --inputs IN.safetensors "
                         "--out OUT.safetensors [--grads G.safetensors] [--dtype f32|bf16|f16] [--checkpoint N] "
                         "[--lora-load L.safetensors] [--lora-save-kohya K.safetensors] [--lora-save-peft P.safetensors]\n");
    std::exit(1);
  }
  return a;
}

// Every tensor of a safetensors file, as (name, new reference) pairs.
std::vector<std::pair<std::string, flame_tensor_t>> load_all(flame_ctx_t ctx, const std::string& path) {
  flame_safetensors_t f = nullptr;
  check(flame_safetensors_load(ctx, path.c_str(), &f), "flame_safetensors_load");
  int64_t n = 0;
  check(flame_safetensors_count(f, &n), "flame_safetensors_count");
  std::vector<std::pair<std::string, flame_tensor_t>> out;
  for (int64_t i = 0; i < n; ++i) {
    const char* name = nullptr;
    check(flame_safetensors_name(f, i, &name), "flame_safetensors_name");
    flame_tensor_t t = nullptr;
    check(flame_safetensors_get(f, name, &t), "flame_safetensors_get");
    out.emplace_back(name, t);
  }
  flame_safetensors_release(f);
  return out;
}

bool is_float(flame_tensor_t t) {
  flame_dtype_t d;
  check(flame_tensor_dtype(t, &d), "flame_tensor_dtype");
  return d == FLAME_DTYPE_F32 || d == FLAME_DTYPE_F16 || d == FLAME_DTYPE_BF16 || d == FLAME_DTYPE_F64;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  flame_ctx_options_t o;
  check(flame_ctx_options_init(&o), "flame_ctx_options_init");
  flame_ctx_t ctx = nullptr;
  check(flame_ctx_create(&o, &ctx), "flame_ctx_create");

  flame_model_t model = nullptr;
  if (!a.load.empty()) {
    const std::string options = a.options.empty() ? "{\"dtype\": \"" + a.dtype + "\"}" : a.options;
    check(flame_model_load(ctx, a.load.c_str(), options.c_str(), &model), "flame_model_load");
  } else {
    const std::string config = a.config.empty() ? "{}" : read_text(a.config);
    const std::string options = "{\"dtype\": \"" + a.dtype + "\"}";
    check(flame_model_create(ctx, a.arch.c_str(), config.c_str(), options.c_str(), &model), "flame_model_create");
  }
  check(flame_model_set_checkpointing(model, a.checkpoint), "flame_model_set_checkpointing");
  flame_params_t params = nullptr;
  check(flame_model_params(model, &params), "flame_model_params");
  if (a.load.empty())
    check(flame_params_load_safetensors(params, a.weights.c_str(), FLAME_PARAMS_LOAD_CONVERT_DTYPE), "loading the weights");
  flame_params_t lora = nullptr;
  if (!a.lora_load.empty())
    check(flame_model_load_lora(model, a.lora_load.c_str(),
                                a.lora_options.empty() ? "{\"trainable\": true}" : a.lora_options.c_str(), &lora),
          "flame_model_load_lora");
  if (!a.lora_save_kohya.empty())
    check(flame_model_save_lora(model, nullptr, a.lora_save_kohya.c_str(), "{\"format\": \"kohya\"}"),
          "flame_model_save_lora (kohya)");
  if (!a.lora_save_peft.empty())
    check(flame_model_save_lora(model, nullptr, a.lora_save_peft.c_str(), "{\"format\": \"peft\"}"),
          "flame_model_save_lora (peft)");

  flame_params_t inputs = nullptr;
  check(flame_params_create(ctx, &inputs), "flame_params_create");
  auto input_tensors = load_all(ctx, a.inputs);
  for (auto& [name, t] : input_tensors) {
    if (is_float(t) && !a.grads.empty()) check(flame_tensor_set_requires_grad(t, 1), "flame_tensor_set_requires_grad");
    check(flame_params_add(inputs, name.c_str(), t), "flame_params_add");
  }
  flame_params_t outputs = nullptr;
  check(flame_model_forward(model, inputs, &outputs), "flame_model_forward");

  std::vector<std::string> names;
  std::vector<flame_tensor_t> tensors, owned;
  if (a.grads.empty()) {
    int64_t n = 0;
    check(flame_params_count(outputs, &n), "flame_params_count");
    for (int64_t i = 0; i < n; ++i) {
      const char* name = nullptr;
      flame_tensor_t t = nullptr;
      check(flame_params_name(outputs, i, &name), "flame_params_name");
      check(flame_params_tensor(outputs, i, &t), "flame_params_tensor");
      names.push_back(std::string("out.") + name);
      tensors.push_back(t);
    }
  } else {
    flame_tensor_t loss = nullptr;
    auto grads = load_all(ctx, a.grads);
    for (auto& [name, g] : grads) {
      flame_tensor_t y = nullptr;
      check(flame_params_find(outputs, name.c_str(), &y), "flame_params_find");
      if (!y) {
        std::fprintf(stderr, "flame_model_run: the model has no output %s\n", name.c_str());
        return 1;
      }
      names.push_back("out." + name);
      tensors.push_back(y);
      flame_tensor_t prod = nullptr, s = nullptr;
      check(flame_mul(y, g, &prod), "flame_mul");
      check(flame_sum_all(prod, &s), "flame_sum_all");
      flame_tensor_release(prod);
      if (loss) {
        flame_tensor_t next = nullptr;
        check(flame_add(loss, s, &next), "flame_add");
        flame_tensor_release(loss);
        flame_tensor_release(s);
        loss = next;
      } else {
        loss = s;
      }
      flame_tensor_release(g);
    }
    check(flame_backward(ctx, loss, nullptr, 0), "flame_backward");
    flame_tensor_release(loss);
    int64_t n = 0;
    check(flame_params_count(params, &n), "flame_params_count");
    for (int64_t i = 0; i < n; ++i) {
      const char* name = nullptr;
      flame_tensor_t p = nullptr, g = nullptr;
      check(flame_params_name(params, i, &name), "flame_params_name");
      check(flame_params_tensor(params, i, &p), "flame_params_tensor");
      check(flame_tensor_grad(p, &g), "flame_tensor_grad");
      if (!g) continue;  // no gradient reached it (e.g. an unused embedding row set)
      names.push_back(std::string("grad.") + name);
      tensors.push_back(g);
      owned.push_back(g);
    }
    int64_t n_lora = 0;
    if (lora) check(flame_params_count(lora, &n_lora), "flame_params_count");
    for (int64_t i = 0; i < n_lora; ++i) {
      const char* name = nullptr;
      flame_tensor_t p = nullptr, g = nullptr;
      check(flame_params_name(lora, i, &name), "flame_params_name");
      check(flame_params_tensor(lora, i, &p), "flame_params_tensor");
      check(flame_tensor_grad(p, &g), "flame_tensor_grad");
      if (!g) continue;
      names.push_back(std::string("lora_grad.") + name);
      tensors.push_back(g);
      owned.push_back(g);
    }
    for (auto& [name, t] : input_tensors) {
      flame_tensor_t g = nullptr;
      check(flame_tensor_grad(t, &g), "flame_tensor_grad");
      if (!g) continue;
      names.push_back("grad_input." + name);
      tensors.push_back(g);
      owned.push_back(g);
    }
  }
  std::vector<const char*> cnames;
  for (const auto& n : names) cnames.push_back(n.c_str());
  check(flame_safetensors_save(ctx, a.out.c_str(), cnames.data(), tensors.data(), static_cast<int64_t>(tensors.size()),
                               nullptr, 0),
        "flame_safetensors_save");
  for (flame_tensor_t t : owned) flame_tensor_release(t);
  for (auto& [name, t] : input_tensors) flame_tensor_release(t);
  flame_params_release(outputs);
  flame_params_release(inputs);
  flame_params_release(params);
  flame_params_release(lora);
  flame_model_release(model);
  flame_ctx_destroy(ctx);
  std::printf("flame_model_run: %s: wrote %zu tensors to %s\n", a.arch.c_str(), tensors.size(), a.out.c_str());
  return 0;
}
