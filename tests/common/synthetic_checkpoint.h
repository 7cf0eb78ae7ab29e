// Small synthetic checkpoints on disk for the loader tests (CPU and GPU): safetensors files written
// byte by byte (any dtype name the format has, whether FLAME has it or not), text files, and a
// scratch folder removed with everything in it.
#pragma once
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace synth {

// One tensor of a file: its bytes default to a pattern of the right size when data is empty.
struct Tensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<unsigned char> data;
};

inline size_t dtype_bytes(const std::string& d) {
  static const std::map<std::string, size_t> sizes{
      {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4}, {"F64", 8}, {"I64", 8}, {"U64", 8}, {"C64", 8}};
  auto it = sizes.find(d);
  if (it == sizes.end()) throw std::runtime_error("synth: unknown dtype " + d);
  return it->second;
}

inline size_t byte_size(const Tensor& t) {
  size_t n = dtype_bytes(t.dtype);
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  return n;
}

// A whole safetensors file: tensors back to back in the given order.
inline std::string safetensors_bytes(const std::vector<Tensor>& tensors) {
  std::string json = "{";
  std::string data;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const size_t n = byte_size(t);
    std::string bytes(n, '\0');
    if (t.data.empty()) {
      for (size_t b = 0; b < n; ++b) bytes[b] = static_cast<char>((b * 7 + i) & 0x3f);
    } else {
      if (t.data.size() != n) throw std::runtime_error("synth: wrong data size for " + t.name);
      bytes.assign(t.data.begin(), t.data.end());
    }
    json += (i ? ",\"" : "\"") + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) json += (d ? "," : "") + std::to_string(t.shape[d]);
    json += "],\"data_offsets\":[" + std::to_string(data.size()) + "," + std::to_string(data.size() + n) + "]}";
    data += bytes;
  }
  json += "}";
  while (json.size() % 8) json += ' ';
  std::string out(8, '\0');
  uint64_t len = json.size();
  for (int b = 0; b < 8; ++b) out[b] = static_cast<char>((len >> (8 * b)) & 0xff);
  return out + json + data;
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("synth: cannot write " + path);
}

inline void write_safetensors(const std::string& path, const std::vector<Tensor>& tensors) {
  write_text(path, safetensors_bytes(tensors));
}

// A scratch folder under $TMPDIR (or /tmp), removed recursively with everything in it.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/flame-ckpt-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) throw std::runtime_error("synth: mkdtemp failed");
    path_ = buf.data();
  }
  ~TempDir() {
    nftw(path_.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return std::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // path/rel, creating the folder rel names when make_folder.
  std::string sub(const std::string& rel, bool make_folder = false) const {
    const std::string p = path_ + "/" + rel;
    if (make_folder) ::mkdir(p.c_str(), 0755);
    return p;
  }

 private:
  std::string path_;
};

}  // namespace synth
