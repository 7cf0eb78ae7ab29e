// What the key tables of SD3, AutoencoderKL, CLIP and T5 share: a parameter under its diffusers /
// transformers name as a piece of one tensor stored under the original layout's name, a builder
// that emits both lists side by side (so they cannot disagree), and an index over a checkpoint's
// key list for detection (lookups, block counting, and the final check that every tensor of the
// implied configuration is present with its shape, naming the key that is not).
//
// A piece is rows [row_begin, row_begin + rows) of the stored tensor (dim 0, the other dims whole),
// optionally with its two halves swapped (a modulation stored [shift; scale] that diffusers keeps
// [scale; shift]) or transposed (a 2-D projection stored [in, out] for a Linear's [out, in]). The
// stored piece and the diffusers parameter have the same elements in the same order otherwise; their
// shapes may differ only by trailing 1-sized dims (a 1x1 convolution's [C, C, 1, 1] for a Linear's
// [C, C]): a reshape.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>
#include "models/flux_keys.h"  // KeyShape

namespace flame::models {

struct MappedParameter {
  std::string diffusers_name;
  std::vector<int64_t> shape;  // under the diffusers / transformers name
  std::string original_name;
  int64_t row_begin = 0;
  int64_t rows = 0;
  bool swap_halves = false;
  bool transposed = false;
};

struct MappedTable {
  std::vector<KeyShape> original;              // stored tensors, in the order the parameters first use them
  std::vector<MappedParameter> parameters;     // in the real class's state_dict order

  // The parameters as (diffusers name, shape).
  std::vector<KeyShape> diffusers_tensors() const;
};

// Emits parameters in the real class's order; each piece registers its stored tensor on first use
// (a later piece of the same tensor must agree about its shape).
class MappedTableBuilder {
 public:
  // A parameter stored whole under oname with the same shape (a pure renaming; oname may equal dname).
  void same(const std::string& dname, const std::string& oname, const std::vector<int64_t>& shape);
  // A parameter stored whole with another shape of the same elements (trailing 1-sized dims).
  void reshaped(const std::string& dname, const std::vector<int64_t>& dshape, const std::string& oname,
                const std::vector<int64_t>& oshape);
  // A 2-D parameter [a, b] stored transposed as [b, a].
  void transposed(const std::string& dname, const std::string& oname, const std::vector<int64_t>& shape);
  // Rows [begin, begin + shape[0]) of the stored tensor oname of shape oshape (halves swapped if asked).
  void rows(const std::string& dname, const std::vector<int64_t>& shape, const std::string& oname,
            const std::vector<int64_t>& oshape, int64_t begin, bool swap_halves = false);
  // A Linear or convolution stored whole: dname.weight / .bias from oname.weight / .bias.
  void weight_bias(const std::string& dname, const std::string& oname, const std::vector<int64_t>& weight);

  MappedTable take() { return std::move(table_); }

 private:
  void register_original(const std::string& oname, const std::vector<int64_t>& oshape);
  MappedTable table_;
  std::map<std::string, size_t> original_index_;
};

// A checkpoint's key list, indexed by name; `family` names the model in error messages ("SD3").
// Every failure is FLAME_ERROR_INVALID_FORMAT naming the key.
class KeyIndex {
 public:
  KeyIndex(const std::vector<KeyShape>& keys, std::string family);

  const KeyShape* find(const std::string& name) const;
  bool has(const std::string& name) const { return find(name) != nullptr; }
  bool has_prefix(const std::string& head) const;
  // The tensor `name` of the given rank, or an error naming it.
  const KeyShape& need(const std::string& name, size_t rank) const;
  // The distinct integers right after `head` in the names that start with it (an error for a name
  // with no integer there).
  std::set<int64_t> indices_after(const std::string& head) const;
  // n when the indices after head are exactly 0..n-1 (0 for none; an error for a gap).
  int64_t count_indices(const std::string& head) const;
  // Every tensor of `want` (names without the prefix) is present under prefix with its shape; other
  // keys are left alone (single files bundle other components). `model` describes the implied
  // configuration in the message.
  void expect_all(const std::vector<KeyShape>& want, const std::string& prefix, const std::string& model) const;

 private:
  std::map<std::string, const KeyShape*> by_name_;
  std::string family_;
};

}  // namespace flame::models
