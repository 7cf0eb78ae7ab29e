// The shared key-table builder and checkpoint key index (see mapped_keys.h).
#include "models/mapped_keys.h"
#include <algorithm>
#include <cctype>
#include "core/error.h"
#include "core/shape.h"

namespace flame::models {

std::vector<KeyShape> MappedTable::diffusers_tensors() const {
  std::vector<KeyShape> out;
  out.reserve(parameters.size());
  for (const MappedParameter& p : parameters) out.push_back({p.diffusers_name, p.shape});
  return out;
}

void MappedTableBuilder::register_original(const std::string& oname, const std::vector<int64_t>& oshape) {
  auto it = original_index_.find(oname);
  if (it == original_index_.end()) {
    original_index_[oname] = table_.original.size();
    table_.original.push_back({oname, oshape});
    return;
  }
  FLAME_CHECK(table_.original[it->second].shape == oshape, FLAME_ERROR_INTERNAL, "key table: ", oname,
              " registered as ", shape_str(table_.original[it->second].shape), " and as ", shape_str(oshape));
}

void MappedTableBuilder::same(const std::string& dname, const std::string& oname, const std::vector<int64_t>& shape) {
  rows(dname, shape, oname, shape, 0);
}

void MappedTableBuilder::reshaped(const std::string& dname, const std::vector<int64_t>& dshape,
                                  const std::string& oname, const std::vector<int64_t>& oshape) {
  register_original(oname, oshape);
  table_.parameters.push_back({dname, dshape, oname, 0, oshape.at(0), false, false});
}

void MappedTableBuilder::transposed(const std::string& dname, const std::string& oname,
                                    const std::vector<int64_t>& shape) {
  const std::vector<int64_t> oshape{shape.at(1), shape.at(0)};
  register_original(oname, oshape);
  table_.parameters.push_back({dname, shape, oname, 0, oshape[0], false, true});
}

void MappedTableBuilder::rows(const std::string& dname, const std::vector<int64_t>& shape, const std::string& oname,
                              const std::vector<int64_t>& oshape, int64_t begin, bool swap_halves) {
  register_original(oname, oshape);
  table_.parameters.push_back({dname, shape, oname, begin, shape.at(0), swap_halves, false});
}

void MappedTableBuilder::weight_bias(const std::string& dname, const std::string& oname,
                                     const std::vector<int64_t>& weight) {
  same(dname + ".weight", oname + ".weight", weight);
  same(dname + ".bias", oname + ".bias", {weight.at(0)});
}

KeyIndex::KeyIndex(const std::vector<KeyShape>& keys, std::string family) : family_(std::move(family)) {
  for (const KeyShape& k : keys) by_name_[k.name] = &k;
}

const KeyShape* KeyIndex::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

bool KeyIndex::has_prefix(const std::string& head) const {
  auto it = by_name_.lower_bound(head);
  return it != by_name_.end() && it->first.compare(0, head.size(), head) == 0;
}

const KeyShape& KeyIndex::need(const std::string& name, size_t rank) const {
  const KeyShape* k = find(name);
  FLAME_CHECK(k, FLAME_ERROR_INVALID_FORMAT, "not a complete ", family_, " checkpoint: no tensor ", name);
  FLAME_CHECK(k->shape.size() == rank, FLAME_ERROR_INVALID_FORMAT, family_, " tensor ", name, " has ",
              k->shape.size(), " dimensions, expected ", rank);
  return *k;
}

std::set<int64_t> KeyIndex::indices_after(const std::string& head) const {
  std::set<int64_t> out;
  for (auto it = by_name_.lower_bound(head); it != by_name_.end() && it->first.compare(0, head.size(), head) == 0;
       ++it) {
    const std::string& name = it->first;
    const size_t end = name.find('.', head.size());
    const std::string idx = name.substr(head.size(), end == std::string::npos ? std::string::npos : end - head.size());
    FLAME_CHECK(!idx.empty() && idx.size() <= 6 &&
                    std::all_of(idx.begin(), idx.end(),
                                [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; }),
                FLAME_ERROR_INVALID_FORMAT, family_, " tensor ", name, " has no index after ", head);
    out.insert(std::stoll(idx));
  }
  return out;
}

int64_t KeyIndex::count_indices(const std::string& head) const {
  const std::set<int64_t> idx = indices_after(head);
  if (idx.empty()) return 0;
  const int64_t n = *idx.rbegin() + 1;
  FLAME_CHECK(static_cast<int64_t>(idx.size()) == n, FLAME_ERROR_INVALID_FORMAT, family_, " checkpoint has ", head,
              n - 1, " but not every index below it");
  return n;
}

void KeyIndex::expect_all(const std::vector<KeyShape>& want, const std::string& prefix,
                          const std::string& model) const {
  for (const KeyShape& w : want) {
    const KeyShape* k = find(prefix + w.name);
    FLAME_CHECK(k, FLAME_ERROR_INVALID_FORMAT, family_, " checkpoint lacks ", prefix + w.name, " (", model,
                " has it)");
    FLAME_CHECK(k->shape == w.shape, FLAME_ERROR_INVALID_FORMAT, family_, " tensor ", prefix + w.name, " has shape ",
                shape_str(k->shape), ", expected ", shape_str(w.shape));
  }
}

}  // namespace flame::models
