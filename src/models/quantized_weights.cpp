// The quantize option and the quantise / dequantise operations (quantized_weights.h).
#include "models/quantized_weights.h"
#include "core/error.h"
#include "ops/ops.h"
#include "ops/quantized.h"
#include "runtime/context.h"

namespace flame::models {

namespace {

const char kScaleSuffix[] = ".scale_weight";
const char kWeightSuffix[] = ".weight";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_f8(DType d) { return d == FLAME_DTYPE_F8_E4M3 || d == FLAME_DTYPE_F8_E5M2; }

}  // namespace

WeightQuantization parse_weight_quantization(const nlohmann::json& value) {
  WeightQuantization q;
  if (value.is_null() || (value.is_boolean() && !value.get<bool>())) return q;
  FLAME_CHECK(value.is_object(), FLAME_ERROR_INVALID_ARGUMENT,
              "options: \"quantize\" must be an object such as {\"dtype\": \"f8_e4m3\", \"scale\": \"tensor\"} or "
              "{\"dtype\": \"nf4\"} (or null)");
  for (auto it = value.begin(); it != value.end(); ++it)
    FLAME_CHECK(it.key() == "dtype" || it.key() == "scale" || it.key() == "block_size" || it.key() == "double_quant",
                FLAME_ERROR_INVALID_ARGUMENT, "options: unknown key \"quantize.", it.key(),
                "\" (known: quantize.dtype, quantize.scale, quantize.block_size, quantize.double_quant)");
  q.enabled = true;
  if (value.contains("dtype")) {
    const nlohmann::json& d = value["dtype"];
    const std::string name = d.is_string() ? d.get<std::string>() : std::string();
    const bool known = name == "f8_e4m3" || name == "float8_e4m3fn" || name == "nf4";
    FLAME_CHECK(known, FLAME_ERROR_INVALID_ARGUMENT, "options: \"quantize.dtype\" is ", d.dump(),
                ", not \"f8_e4m3\" (or \"float8_e4m3fn\") or \"nf4\", the quantised formats FLAME has");
    if (name == "nf4") q.format = QuantFormat::Nf4;
  }
  const char* format = q.format == QuantFormat::Nf4 ? "nf4" : "f8_e4m3";
  for (const char* key : {"block_size", "double_quant"})
    FLAME_CHECK(q.format == QuantFormat::Nf4 || !value.contains(key), FLAME_ERROR_INVALID_ARGUMENT, "options: \"quantize.", key,
                "\" is an option of \"dtype\": \"nf4\", not of ", format);
  FLAME_CHECK(q.format == QuantFormat::Fp8 || !value.contains("scale"), FLAME_ERROR_INVALID_ARGUMENT,
              "options: \"quantize.scale\" is an option of fp8, not of nf4 (whose scales are one absmax per block_size elements)");
  if (value.contains("scale")) {
    const nlohmann::json& s = value["scale"];
    const bool tensor = s.is_string() && s.get<std::string>() == "tensor", row = s.is_string() && s.get<std::string>() == "row";
    FLAME_CHECK(tensor || row, FLAME_ERROR_INVALID_ARGUMENT, "options: \"quantize.scale\" is ", s.dump(),
                ", not \"tensor\" (one scale per weight) or \"row\" (one per output row)");
    q.scale = row ? QuantScale::PerRow : QuantScale::PerTensor;
  }
  if (value.contains("block_size")) {
    const nlohmann::json& b = value["block_size"];
    const int64_t v = b.is_number_integer() ? b.get<int64_t>() : 0;
    FLAME_CHECK(v >= 16 && v <= 4096 && (v & (v - 1)) == 0, FLAME_ERROR_INVALID_ARGUMENT, "options: \"quantize.block_size\" is ",
                b.dump(), ", not a power of two in [16, 4096]");
    q.block_size = v;
  }
  if (value.contains("double_quant")) {
    FLAME_CHECK(value["double_quant"].is_boolean(), FLAME_ERROR_INVALID_ARGUMENT, "options: \"quantize.double_quant\" is ",
                value["double_quant"].dump(), ", not a boolean");
    q.double_quant = value["double_quant"].get<bool>();
  }
  return q;
}

std::string scale_weight_name(const std::string& weight_name) {
  FLAME_CHECK(ends_with(weight_name, kWeightSuffix), FLAME_ERROR_INTERNAL, "a quantised weight's name ", weight_name,
              " does not end with .weight");
  return weight_name.substr(0, weight_name.size() - (sizeof(kWeightSuffix) - 1)) + kScaleSuffix;
}

bool is_scale_weight_name(const std::string& name) { return ends_with(name, kScaleSuffix); }

Shape scale_shape(QuantScale scale, const Shape& weight_shape) {
  FLAME_CHECK(weight_shape.size() == 2, FLAME_ERROR_INTERNAL, "a quantised weight must be 2-D, not ", shape_str(weight_shape));
  return scale == QuantScale::PerRow ? Shape{weight_shape[0], 1} : Shape{};
}

void quantize_into(const Tensor& w, const Tensor& q, const Tensor& scale) {
  FLAME_CHECK(w->ndim() == 2 && q->shape == w->shape && q->dtype == FLAME_DTYPE_F8_E4M3 && scale->dtype == FLAME_DTYPE_F32,
              FLAME_ERROR_INTERNAL, "quantize_into: a ", shape_str(w->shape), " weight into a ", dtype_name(q->dtype), " ",
              shape_str(q->shape), " tensor with a ", dtype_name(scale->dtype), " scale");
  const bool per_row = scale->ndim() == 2;
  FLAME_CHECK(per_row ? scale->shape == Shape({w->shape[0], 1}) : scale->ndim() == 0, FLAME_ERROR_INTERNAL,
              "quantize_into: a scale of shape ", shape_str(scale->shape), " for a ", shape_str(w->shape), " weight");
  GradModeGuard no_grad(w->ctx(), w->ctx().mode.with_grad(false));  // not recorded
  const Tensor wf = w->dtype == FLAME_DTYPE_F32 ? w : ops::to_dtype(w, FLAME_DTYPE_F32);
  const Tensor amax = per_row ? ops::amax(ops::abs(wf), {1}, true) : ops::amax(ops::abs(wf), {0, 1}, false);
  // An all-zero weight (a zero-initialised layer) gets a tiny scale and quantises to zeros.
  const Tensor s = ops::mul_scalar(ops::unary(OpId::Clamp, amax, 1e-12, 3.0e38), 1.0 / kF8E4M3Max);
  // |w / s| <= 448 up to f32 rounding, which e4m3's round-to-nearest-even brings back to 448.
  ops::copy_into(q, ops::div(wf, s));
  ops::copy_into(scale, s);
}

Tensor dequantize(const Tensor& q, const Tensor& scale, DType dtype) {
  GradModeGuard no_grad(q->ctx(), q->ctx().mode.with_grad(false));  // not recorded
  const Tensor s = scale->dtype == FLAME_DTYPE_F32 ? scale : ops::to_dtype(scale, FLAME_DTYPE_F32);
  if (is_f8(q->dtype)) return ops::dequantize(q, s, dtype);  // one kernel, no f32 temporary
  // a scaled weight of another dtype (a file's bf16 weight with a scale): the same arithmetic, composed
  const Tensor w = ops::mul(ops::to_dtype(q, FLAME_DTYPE_F32), s);
  return dtype == FLAME_DTYPE_F32 ? w : ops::to_dtype(w, dtype);
}

}  // namespace flame::models
