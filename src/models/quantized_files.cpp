// Quantised weights in checkpoint files (quantized_files.h): reading stored F8 weights and scales,
// quantising other weights while loading, and the scale tensors of original-layout saves.
#include "models/quantized_files.h"
#include <algorithm>
#include <cstring>
#include "core/error.h"
#include "ops/ops.h"
#include "ops/nf4.h"
#include "ops/quantized.h"

namespace flame::models {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const KeyShape& key_shape(const CheckpointFiles& view, const std::string& key) {
  const std::vector<KeyShape>& keys = view.keys();
  auto it = std::lower_bound(keys.begin(), keys.end(), key, [](const KeyShape& a, const std::string& k) { return a.name < k; });
  FLAME_CHECK(it != keys.end() && it->name == key, FLAME_ERROR_INVALID_ARGUMENT, view.source(), " has no key '", key, "'");
  return *it;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The scale stored under key for the rows of src's weight that a parameter of `rows` rows reads:
// a 0-d f32 tensor (a scalar in the file) or an f32 [rows, 1] column (a scale per stored row).
Tensor read_scale(Context& c, const CheckpointFiles& view, const ParamSource& src, const std::string& key, int64_t rows) {
  const std::vector<int64_t>& shape = key_shape(view, key).shape;
  const std::vector<int64_t>& weight_shape = key_shape(view, src.key).shape;
  const int64_t n = numel_of(shape);
  if (n == 1) {
    Tensor s = ops::empty(c, {}, FLAME_DTYPE_F32);
    view.read_into(key, s);
    return s;
  }
  const bool column = (shape.size() == 1 || (shape.size() == 2 && shape[1] == 1)) && !weight_shape.empty() &&
                      shape[0] == weight_shape[0];
  FLAME_CHECK(column, FLAME_ERROR_INVALID_FORMAT, view.source(), ": the scale '", key, "' has shape ", shape_str(shape),
              ", neither a scalar nor one per row of '", src.key, "' ", shape_str(weight_shape));
  FLAME_CHECK(!src.transposed, FLAME_ERROR_INVALID_FORMAT, view.source(), ": the scale '", key,
              "' holds one value per row of '", src.key, "', which is stored transposed: its rows are not the layer's");
  Tensor s = ops::empty(c, {rows, 1}, FLAME_DTYPE_F32);
  if (src.swap_halves) {
    const int64_t h = rows / 2;
    view.read_into(key, ops::narrow(s, 0, 0, h), src.row_begin + h, h);
    view.read_into(key, ops::narrow(s, 0, h, h), src.row_begin, h);
  } else {
    view.read_into(key, s, src.row_begin, src.rows);
  }
  return s;
}

// Writes a stored scale (0-d or [rows, 1]) into a model's scale parameter (0-d or [rows, 1]).
void assign_scale(const Tensor& stored, const Tensor& param, const std::string& where) {
  if (param->ndim() == stored->ndim()) {
    ops::copy_into(param, stored);
  } else if (stored->ndim() == 0) {  // one scale for every row
    ops::copy_into(param, ops::expand(ops::reshape(stored, {1, 1}), param->shape));
  } else {  // one scale per row into one per tensor: only when they are all the same
    std::vector<float> v(static_cast<size_t>(stored->numel()));
    ops::to_host(stored, v.data(), v.size() * sizeof(float));
    const bool same = std::all_of(v.begin(), v.end(), [&](float x) { return std::memcmp(&x, &v[0], sizeof(float)) == 0; });
    FLAME_CHECK(same, FLAME_ERROR_INVALID_ARGUMENT, where,
                " holds a different scale per row; load it with \"quantize\": {\"scale\": \"row\"}");
    ops::fill_(param, static_cast<double>(v[0]));
  }
}

// src's weight into dst (any float dtype), times its scale when scale_key names one.
void read_dequantized(const CheckpointFiles& view, const ParamSource& src, const std::string& scale_key, const Tensor& dst) {
  if (scale_key.empty()) {
    read_parameter(view, src, dst);
    return;
  }
  Context& c = dst->ctx();
  const StoredTensor& st = view.stored(src.key);
  const Tensor q = ops::empty(c, dst->shape, st.supported ? st.dtype : dst->dtype);
  read_parameter(view, src, q);
  Tensor s = read_scale(c, view, src, scale_key, dst->shape[0]);
  if (s->ndim() == 2 && dst->ndim() != 2) {  // a linear weight stored as a 1x1 convolution
    Shape per_row(static_cast<size_t>(dst->ndim()), 1);
    per_row[0] = dst->shape[0];
    s = ops::reshape(s, per_row);
  }
  const bool f8 = q->dtype == FLAME_DTYPE_F8_E4M3 || q->dtype == FLAME_DTYPE_F8_E5M2;
  if (f8 && dst->contiguous() && (dst->dtype == FLAME_DTYPE_F32 || dst->dtype == FLAME_DTYPE_BF16 ||
                                  dst->dtype == FLAME_DTYPE_F16 || dst->dtype == FLAME_DTYPE_F64))
    ops::dequantize_into(q, s, dst);  // straight into the parameter, one kernel
  else
    ops::copy_into(dst, dequantize(q, s, dst->dtype));
}

}  // namespace

std::string stored_scale_key(const std::string& weight_key) {
  if (!ends_with(weight_key, ".weight") || weight_key.size() == 7) return std::string();
  return weight_key.substr(0, weight_key.size() - 7) + ".scale_weight";
}

bool is_ignorable_quantization_key(const std::string& key) {
  return key == "scaled_fp8" || ends_with(key, ".scaled_fp8") || ends_with(key, ".scale_input");
}

std::string read_weight(const Model& model, const CheckpointFiles& view, const ParamSource& src, const std::string& name,
                        const Tensor& dst) {
  const std::string candidate = stored_scale_key(src.key);
  const std::string scale_key = !candidate.empty() && view.contains(candidate) ? candidate : std::string();
  if (model.is_nf4_weight(name)) {  // quantised on the GPU from an f32 copy of this one weight
    const ops::Nf4Weight nf4 = model.nf4_weight(name);
    const Tensor full = ops::empty(dst->ctx(), {nf4.out_features(), nf4.in_features()}, FLAME_DTYPE_F32);
    read_dequantized(view, src, scale_key, full);
    ops::nf4_quantize_into(full, nf4);
    return scale_key;
  }
  const Tensor* scale = model.quantization_scale(name);
  if (!scale) {
    read_dequantized(view, src, scale_key, dst);
    return scale_key;
  }
  Context& c = dst->ctx();
  const StoredTensor& st = view.stored(src.key);
  if (st.supported && st.dtype == FLAME_DTYPE_F8_E4M3) {  // as stored, bit for bit
    read_parameter(view, src, dst);
    const Tensor s = scale_key.empty() ? ops::full(c, {}, FLAME_DTYPE_F32, 1.0) : read_scale(c, view, src, scale_key, dst->shape[0]);
    assign_scale(s, *scale, view.source() + ": '" + scale_key + "'");
    return scale_key;
  }
  const Tensor full = ops::empty(c, dst->shape, FLAME_DTYPE_F32);  // this one weight, never the model
  read_dequantized(view, src, scale_key, full);
  quantize_into(full, dst, *scale);
  return scale_key;
}

std::vector<OriginalScale> original_scales(const Model& model, const OriginalSavePlan& plan) {
  std::vector<OriginalScale> out;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const OriginalTensor& t = plan.tensors[i];
    size_t quantized = 0;
    bool per_row = false, transposed_row = false;
    for (const OriginalPiece& p : t.pieces)
      if (const Tensor* s = model.quantization_scale(p.parameter)) {
        ++quantized;
        per_row = per_row || (*s)->ndim() == 2;
        transposed_row = transposed_row || ((*s)->ndim() == 2 && p.transposed);
      }
    if (quantized == 0) continue;
    FLAME_CHECK(quantized == t.pieces.size(), FLAME_ERROR_INTERNAL, "the stored tensor ", t.name,
                " mixes quantised and plain parameters");
    FLAME_CHECK(!transposed_row, FLAME_ERROR_INVALID_ARGUMENT, "the stored tensor ", t.name,
                " holds a weight transposed, whose scale per row the layout cannot store; quantise with \"scale\": \"tensor\"");
    const std::string name = stored_scale_key(t.name);
    FLAME_CHECK(!name.empty() && !t.shape.empty(), FLAME_ERROR_INVALID_ARGUMENT, "the stored tensor ", t.name,
                " holds quantised weights but is no \"<module>.weight\": its scale has no name");
    OriginalScale s;
    s.name = name;
    s.tensor = i;
    if (per_row || t.pieces.size() > 1) s.shape = {t.shape[0], 1};
    out.push_back(s);
  }
  return out;
}

Tensor original_scale_tensor(const Model& model, const OriginalSavePlan& plan, const OriginalScale& s) {
  const OriginalTensor& t = plan.tensors.at(s.tensor);
  if (s.shape.empty()) return *model.quantization_scale(t.pieces.at(0).parameter);
  std::vector<Tensor> parts;
  for (const OriginalPiece& p : t.pieces) {
    Tensor sc = *model.quantization_scale(p.parameter);
    if (sc->ndim() == 0) {
      parts.push_back(ops::expand(ops::reshape(sc, {1, 1}), {p.rows, 1}));
      continue;
    }
    if (p.swap_halves) {
      const int64_t h = sc->shape[0] / 2;
      sc = ops::cat({ops::narrow(sc, 0, h, h), ops::narrow(sc, 0, 0, h)}, 0);
    }
    parts.push_back(sc);
  }
  return ops::contiguous(parts.size() == 1 ? parts.front() : ops::cat(parts, 0));
}

}  // namespace flame::models
