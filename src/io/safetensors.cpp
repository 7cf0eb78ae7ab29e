// safetensors parsing, validation and header writing (see safetensors.h for the rules enforced).
//
// parse(): length prefix -> UTF-8 check of the header bytes -> nlohmann-json SAX pass (Sax below)
// that follows the schema event by event and stops at the first deviation -> validate(): dtypes,
// sizes with overflow checks, byte ranges against the data region. Messages quote names cut to a
// readable length, so a hostile 100 MB name never ends up in an error message.
#include "io/safetensors.h"
#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>
#include "core/error.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; FLAME copies it unconverted on little-endian hosts only");

namespace flame::st {

namespace {

// Every dtype the format defines, in the order of the reference implementation's Dtype enum (the
// Python package writes tensors sorted by that order, descending, then by name), with its element
// size in bits and FLAME's dtype where there is one.
struct FormatDtype {
  const char* name;
  uint32_t bits;
  int flame;  // -1: FLAME lacks it
};
constexpr FormatDtype kFormatDtypes[] = {
    {"BOOL", 8, FLAME_DTYPE_BOOL}, {"F4", 4, -1},       {"F6_E2M3", 6, -1},           {"F6_E3M2", 6, -1},
    {"U8", 8, FLAME_DTYPE_U8},     {"I8", 8, -1},       {"F8_E5M2", 8, FLAME_DTYPE_F8_E5M2}, {"F8_E4M3", 8, FLAME_DTYPE_F8_E4M3},
    {"F8_E8M0", 8, -1},            {"I16", 16, -1},     {"U16", 16, -1},              {"F16", 16, FLAME_DTYPE_F16},
    {"BF16", 16, FLAME_DTYPE_BF16}, {"I32", 32, FLAME_DTYPE_I32}, {"U32", 32, -1},    {"F32", 32, FLAME_DTYPE_F32},
    {"C64", 64, -1},               {"F64", 64, FLAME_DTYPE_F64}, {"I64", 64, FLAME_DTYPE_I64}, {"U64", 64, -1},
};

// The position of a FLAME dtype in kFormatDtypes.
size_t format_rank(DType d) {
  for (size_t i = 0; i < sizeof kFormatDtypes / sizeof kFormatDtypes[0]; ++i)
    if (kFormatDtypes[i].flame == static_cast<int>(d)) return i;
  fail(FLAME_ERROR_INVALID_ARGUMENT, "dtype ", static_cast<int>(d), " is not a flame_dtype_t");
}

const FormatDtype* find_dtype(const std::string& name) {
  for (const FormatDtype& d : kFormatDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

// A name for messages: quoted, control characters (NUL included) escaped as \xNN, at most ~80
// bytes of it (cut at a UTF-8 character boundary).
std::string qname(const std::string& s) {
  constexpr size_t kMax = 80;
  size_t cut = std::min(s.size(), kMax);
  while (cut < s.size() && cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  std::string out = "'";
  for (size_t i = 0; i < cut; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F) {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  out += "'";
  if (cut < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

[[noreturn]] void bad(const std::string& msg) { fail(FLAME_ERROR_INVALID_FORMAT, msg); }

// ---------------------------------------------------------------------------------------------
// The SAX pass. Each handler returns false after storing the reason in error_, which stops
// nlohmann's parser at once; only values the schema allows are kept. Values of fields a tensor
// entry does not define are skipped (the reference implementation ignores them too).
class Sax {
 public:
  using json = nlohmann::json;
  std::vector<TensorEntry> tensors;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::string error_;

  explicit Sax(const Limits& limits) : limits_(limits) {}
  bool complete() const { return state_ == State::End; }

  bool null() { return scalar("null"); }
  bool boolean(bool) { return scalar("a boolean"); }
  bool binary(json::binary_t&) { return scalar("binary data"); }
  bool number_float(json::number_float_t, const json::string_t&) { return scalar("a non-integer or out-of-range number"); }
  bool number_integer(json::number_integer_t v) {
    if (v >= 0) return number_unsigned(static_cast<json::number_unsigned_t>(v));  // "-0"
    return scalar("a negative number");
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (state_ == State::Shape) {
      if (cur_.shape.size() >= limits_.max_dims)
        return err(tensor() + " has more than " + std::to_string(limits_.max_dims) + " dims");
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return err(tensor() + ": the dim " + std::to_string(v) + " is too large");
      cur_.shape.push_back(static_cast<int64_t>(v));
      return true;
    }
    if (state_ == State::Offsets) {
      if (n_offsets_ >= 2) return err(tensor() + ": data_offsets must hold exactly 2 numbers");
      (n_offsets_++ == 0 ? cur_.begin : cur_.end) = v;
      return true;
    }
    return scalar("a number");
  }
  bool string(json::string_t& s) {
    if (state_ == State::Meta) {
      if (std::memchr(s.data(), 0, s.size()))
        return err("the __metadata__ value of " + qname(key_) + " contains a NUL character");
      metadata.emplace_back(std::move(key_), std::move(s));
      return true;
    }
    if (state_ == State::Tensor && field_ == Field::Dtype) {
      cur_.dtype_name = std::move(s);
      return true;
    }
    return scalar("a string");
  }

  bool start_object(std::size_t) {
    if (++depth_ > kMaxNesting) return err("the header nests deeper than the format allows");
    switch (state_) {
      case State::Start:
        state_ = State::Top;
        return true;
      case State::Top:
        if (key_ == "__metadata__") {
          state_ = State::Meta;
          return true;
        }
        state_ = State::Tensor;
        cur_ = TensorEntry();
        cur_.name = std::move(key_);
        has_dtype_ = has_shape_ = has_offsets_ = false;
        fields_.clear();
        return true;
      case State::Skip:
        ++skip_depth_;
        return true;
      default:
        if (state_ == State::Tensor && field_ == Field::Unknown) return skip();
        return unexpected("an object");
    }
  }
  bool end_object() {
    --depth_;
    switch (state_) {
      case State::Top:
        state_ = State::End;
        return true;
      case State::Meta:
        state_ = State::Top;
        return true;
      case State::Tensor:
        if (!has_dtype_) return err(tensor() + " lacks the field 'dtype'");
        if (!has_shape_) return err(tensor() + " lacks the field 'shape'");
        if (!has_offsets_) return err(tensor() + " lacks the field 'data_offsets'");
        tensors.push_back(std::move(cur_));
        state_ = State::Top;
        return true;
      case State::Skip:
        return unskip();
      default:
        return err("unbalanced JSON object");  // nlohmann reports syntax errors before this
    }
  }
  bool start_array(std::size_t) {
    if (++depth_ > kMaxNesting) return err("the header nests deeper than the format allows");
    if (state_ == State::Skip) {
      ++skip_depth_;
      return true;
    }
    if (state_ == State::Tensor && field_ == Field::Shape) {
      state_ = State::Shape;
      return true;
    }
    if (state_ == State::Tensor && field_ == Field::Offsets) {
      state_ = State::Offsets;
      n_offsets_ = 0;
      return true;
    }
    if (state_ == State::Tensor && field_ == Field::Unknown) return skip();
    return unexpected("an array");
  }
  bool end_array() {
    --depth_;
    if (state_ == State::Skip) return unskip();
    if (state_ == State::Offsets && n_offsets_ != 2) return err(tensor() + ": data_offsets must hold exactly 2 numbers");
    if (state_ != State::Shape && state_ != State::Offsets) return err("unbalanced JSON array");
    state_ = State::Tensor;
    return true;
  }
  bool key(json::string_t& k) {
    if (state_ == State::Skip) return true;
    if (std::memchr(k.data(), 0, k.size())) return err("the key " + qname(k) + " contains a NUL character");
    if (state_ == State::Top) {
      if (!top_keys_.insert(k).second) return err("the name " + qname(k) + " appears twice in the header");
      if (top_keys_.size() - meta_seen() > limits_.max_entries)
        return err("the header lists more than " + std::to_string(limits_.max_entries) + " tensors");
      key_ = std::move(k);
      return true;
    }
    if (state_ == State::Meta) {
      if (!meta_keys_.insert(k).second) return err("the __metadata__ key " + qname(k) + " appears twice");
      if (meta_keys_.size() > limits_.max_entries)
        return err("__metadata__ has more than " + std::to_string(limits_.max_entries) + " entries");
      key_ = std::move(k);
      return true;
    }
    // State::Tensor: the only other state in which an object is open
    if (std::find(fields_.begin(), fields_.end(), k) != fields_.end())
      return err(tensor() + ": the field " + qname(k) + " appears twice");
    if (fields_.size() >= 16) return err(tensor() + " has more than 16 fields");
    fields_.push_back(k);
    if (k == "dtype") {
      field_ = Field::Dtype;
      has_dtype_ = true;
    } else if (k == "shape") {
      field_ = Field::Shape;
      has_shape_ = true;
    } else if (k == "data_offsets") {
      field_ = Field::Offsets;
      has_offsets_ = true;
    } else {
      field_ = Field::Unknown;
    }
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) {
    std::string what = ex.what();
    if (what.size() > 200) what = what.substr(0, 200) + "...";  // the lexer quotes the token it read
    return err("the header is not valid JSON (near byte " + std::to_string(position) + "): " + what);
  }

 private:
  enum class State { Start, Top, Meta, Tensor, Shape, Offsets, Skip, End };
  enum class Field { Dtype, Shape, Offsets, Unknown };
  const Limits limits_;
  State state_ = State::Start;
  Field field_ = Field::Unknown;
  size_t depth_ = 0, skip_depth_ = 0, n_offsets_ = 0;
  std::string key_;  // the last key of the top object or of __metadata__
  TensorEntry cur_;  // the tensor entry being read
  bool has_dtype_ = false, has_shape_ = false, has_offsets_ = false;
  std::vector<std::string> fields_;  // keys seen in cur_'s object
  std::unordered_set<std::string> top_keys_, meta_keys_;

  size_t meta_seen() const { return top_keys_.count("__metadata__"); }
  bool err(std::string msg) {
    if (error_.empty()) error_ = std::move(msg);
    return false;
  }
  std::string tensor() const { return "tensor " + qname(cur_.name); }
  // A value of kind `what` ("a number", "an array") where the schema wants something else.
  bool unexpected(const std::string& what) {
    switch (state_) {
      case State::Start:
        return err("the header must be a JSON object, not " + what);
      case State::Top:
        return err("the entry " + qname(key_) + " must be " +
                   (key_ == "__metadata__" ? "an object of strings" : "an object") + ", not " + what);
      case State::Meta:
        return err("the __metadata__ value of " + qname(key_) + " must be a string, not " + what);
      case State::Tensor:
        return err(tensor() + ": " +
                   (field_ == Field::Dtype   ? "dtype must be a string"
                    : field_ == Field::Shape ? "shape must be an array"
                                             : "data_offsets must be an array") +
                   ", not " + what);
      case State::Shape:
      case State::Offsets:
        return err(tensor() + ": " + (state_ == State::Shape ? "shape" : "data_offsets") +
                   " must hold non-negative integers, not " + what);
      default:
        return err("unexpected " + what + " in the header");
    }
  }
  // A scalar value: part of a skipped field, or unexpected.
  bool scalar(const char* what) {
    if (state_ == State::Skip || (state_ == State::Tensor && field_ == Field::Unknown)) return true;
    return unexpected(what);
  }
  bool skip() {
    state_ = State::Skip;
    skip_depth_ = 1;
    return true;
  }
  bool unskip() {
    if (--skip_depth_ == 0) state_ = State::Tensor;
    return true;
  }
};

// Checks dtypes, sizes and byte ranges of parsed entries against a data region of data_bytes.
void validate(std::vector<TensorEntry>& tensors, uint64_t data_bytes) {
  for (TensorEntry& t : tensors) {
    const FormatDtype* d = find_dtype(t.dtype_name);
    if (!d) bad("tensor " + qname(t.name) + " has the unknown dtype " + qname(t.dtype_name));
    t.supported = d->flame >= 0;
    if (t.supported) t.dtype = static_cast<DType>(d->flame);
    uint64_t numel = 1;
    for (int64_t s : t.shape) {
      if (s != 0 && numel > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(s))
        bad("tensor " + qname(t.name) + ": the shape " + shape_str(t.shape) + " overflows the element count");
      numel *= static_cast<uint64_t>(s);
    }
    if (numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        numel > std::numeric_limits<uint64_t>::max() / d->bits)
      bad("tensor " + qname(t.name) + ": the shape " + shape_str(t.shape) + " has too many elements");
    const uint64_t bits = numel * d->bits;
    if (bits % 8 != 0)
      bad("tensor " + qname(t.name) + ": " + std::to_string(numel) + " elements of " + t.dtype_name +
          " do not fill whole bytes");
    if (t.begin > t.end)
      bad("tensor " + qname(t.name) + ": data_offsets begin " + std::to_string(t.begin) + " is after end " +
          std::to_string(t.end));
    if (t.end > data_bytes)
      bad("tensor " + qname(t.name) + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
          "] reach beyond the data region of " + std::to_string(data_bytes) + " bytes");
    if (t.bytes() != bits / 8)
      bad("tensor " + qname(t.name) + ": data_offsets span " + std::to_string(t.bytes()) + " bytes but shape " +
          shape_str(t.shape) + " of " + t.dtype_name + " needs " + std::to_string(bits / 8));
  }
  // The ranges must tile the data region exactly, in offset order.
  std::vector<const TensorEntry*> by_offset;
  by_offset.reserve(tensors.size());
  for (const TensorEntry& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  const TensorEntry* prev = nullptr;
  for (const TensorEntry* t : by_offset) {
    if (t->begin < at)
      bad("tensor " + qname(t->name) + " overlaps tensor " + qname(prev->name) + " (bytes [" + std::to_string(t->begin) +
          ", " + std::to_string(t->end) + ") and [" + std::to_string(prev->begin) + ", " + std::to_string(prev->end) + "))");
    if (t->begin > at)
      bad("the data region has a gap of " + std::to_string(t->begin - at) + " bytes before tensor " + qname(t->name));
    at = t->end;
    prev = t;
  }
  if (at != data_bytes)
    bad("the data region holds " + std::to_string(data_bytes - at) + " bytes after the last tensor");
}

}  // namespace

bool valid_utf8(const char* s, size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(s);
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07;
    else return false;  // continuation byte, overlong lead (C0, C1) or beyond U+10FFFF (F5..FF)
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;  // overlong, out of range, or a surrogate
    i += len;
  }
  return true;
}

Header parse(const unsigned char* data, size_t size, const Limits& limits) {
  if (size < 8) bad("the file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];  // little-endian u64
  if (n > limits.max_header_bytes)
    bad("the header length " + std::to_string(n) + " is above the limit of " + std::to_string(limits.max_header_bytes) +
        " bytes");
  if (n > size - 8)
    bad("the header length " + std::to_string(n) + " reaches beyond the end of the file (" + std::to_string(size) + " bytes)");
  const char* text = reinterpret_cast<const char*>(data + 8);
  if (!valid_utf8(text, n)) bad("the header is not valid UTF-8");
  // JSON has no raw NUL (strings escape it as \u0000), and nlohmann's lexer would take one for the
  // end of the input and ignore what follows.
  if (const void* nul = std::memchr(text, 0, n))
    bad("the header contains a NUL byte (at header byte " + std::to_string(static_cast<const char*>(nul) - text) + ")");

  Sax sax(limits);
  const bool ok = nlohmann::json::sax_parse(text, text + n, &sax, nlohmann::json::input_format_t::json, true);
  if (!ok || !sax.complete()) bad(sax.error_.empty() ? std::string("the header is not a complete JSON object") : sax.error_);

  Header h;
  h.data_start = 8 + n;
  h.data_bytes = size - h.data_start;
  h.tensors = std::move(sax.tensors);
  h.metadata = std::move(sax.metadata);
  validate(h.tensors, h.data_bytes);
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  std::sort(h.metadata.begin(), h.metadata.end());
  return h;
}

const TensorEntry* Header::find(const std::string& name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorEntry& t, const std::string& n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

const std::string* Header::find_metadata(const std::string& key) const {
  auto it = std::lower_bound(metadata.begin(), metadata.end(), key,
                             [](const std::pair<std::string, std::string>& kv, const std::string& k) { return kv.first < k; });
  return it != metadata.end() && it->first == key ? &it->second : nullptr;
}

const char* format_dtype_name(DType d) { return kFormatDtypes[format_rank(d)].name; }

std::vector<size_t> layout(std::vector<TensorEntry>& tensors,
                           const std::vector<std::pair<std::string, std::string>>& metadata) {
  for (const TensorEntry& t : tensors) {
    FLAME_CHECK(valid_utf8(t.name.data(), t.name.size()), FLAME_ERROR_INVALID_ARGUMENT, "the tensor name ", qname(t.name),
                " is not valid UTF-8");
    FLAME_CHECK(t.name != "__metadata__", FLAME_ERROR_INVALID_ARGUMENT,
                "the tensor name '__metadata__' is reserved by the format");
  }
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // The Python package's order: dtype rank descending (I64, F64, F32, I32, BF16, F16, U8, BOOL for
  // FLAME's dtypes: element sizes never grow, so every tensor starts aligned), then name.
  std::vector<size_t> rank(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) rank[i] = format_rank(tensors[i].dtype);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (rank[a] != rank[b]) return rank[a] > rank[b];
    return tensors[a].name < tensors[b].name;
  });
  for (size_t i = 1; i < order.size(); ++i)
    FLAME_CHECK(tensors[order[i]].name != tensors[order[i - 1]].name, FLAME_ERROR_INVALID_ARGUMENT, "the tensor name ",
                qname(tensors[order[i]].name), " is given twice");
  {
    std::vector<std::string> keys;
    for (const auto& kv : metadata) {
      FLAME_CHECK(valid_utf8(kv.first.data(), kv.first.size()) && valid_utf8(kv.second.data(), kv.second.size()),
                  FLAME_ERROR_INVALID_ARGUMENT, "the metadata entry ", qname(kv.first), " is not valid UTF-8");
      keys.push_back(kv.first);
    }
    std::sort(keys.begin(), keys.end());
    for (size_t i = 1; i < keys.size(); ++i)
      FLAME_CHECK(keys[i] != keys[i - 1], FLAME_ERROR_INVALID_ARGUMENT, "the metadata key ", qname(keys[i]), " is given twice");
  }
  uint64_t at = 0;
  for (size_t i : order) {
    TensorEntry& t = tensors[i];
    t.supported = true;
    t.dtype_name = format_dtype_name(t.dtype);
    const uint64_t bytes = checked_bytes(checked_numel(t.shape), dtype_size(t.dtype));
    FLAME_CHECK(at <= std::numeric_limits<uint64_t>::max() - bytes, FLAME_ERROR_INVALID_ARGUMENT,
                "the tensors hold more bytes than a file can");
    t.begin = at;
    t.end = at + bytes;
    at = t.end;
  }
  return order;
}

std::string serialize_header(const std::vector<TensorEntry>& tensors, const std::vector<size_t>& order,
                             const std::vector<std::pair<std::string, std::string>>& metadata) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto sorted = metadata;
    std::sort(sorted.begin(), sorted.end());
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& kv : sorted) m[kv.first] = kv.second;
    j["__metadata__"] = std::move(m);
  }
  for (size_t i : order) {
    const TensorEntry& t = tensors[i];
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = t.dtype_name;  // field order as the Python package writes it
    e["shape"] = t.shape;
    e["data_offsets"] = {t.begin, t.end};
    j[t.name] = std::move(e);
  }
  std::string text = j.dump();  // compact; non-ASCII stays UTF-8, as serde_json writes it
  text.append((8 - text.size() % 8) % 8, ' ');  // data region starts 8-aligned
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out += text;
  return out;
}

}  // namespace flame::st
