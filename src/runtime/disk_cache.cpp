#include "runtime/disk_cache.h"
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include "runtime/hash.h"

namespace flame {

static const char kMagic[8] = {'F', 'L', 'A', 'M', 'E', 'K', 'C', '1'};

static bool make_dirs(const std::string& dir) {
  std::string cur;
  std::stringstream ss(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

std::string DiskCache::resolve_dir(const char* option) {
  if (option) return option;
  if (const char* env = std::getenv("FLAME_KERNEL_CACHE_DIR")) return env;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/flame/kernels";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/flame/kernels";
  return "";
}

std::string DiskCache::path_for(const std::string& key) const {
  return dir_ + "/" + Hasher().add(key).hex() + ".cubin";
}

static std::string checksum(const std::string& key, const CacheEntry& e) {
  return Hasher().add(key).add(e.lowered_name).add(e.image.data(), e.image.size()).hex();
}

template <class T>
static bool read_pod(std::istream& in, T* v) {
  return static_cast<bool>(in.read(reinterpret_cast<char*>(v), sizeof(T)));
}
static bool read_str(std::istream& in, std::string* s, uint64_t max) {
  uint64_t n = 0;
  if (!read_pod(in, &n) || n > max) return false;
  s->resize(n);
  return n == 0 || static_cast<bool>(in.read(&(*s)[0], static_cast<std::streamsize>(n)));
}

bool DiskCache::load(const std::string& key, CacheEntry* out) const {
  if (!enabled()) return false;
  std::string path = path_for(key);
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  char magic[8];
  std::string stored_key, sum;
  uint32_t ptx = 0;
  std::string image;
  CacheEntry e;
  bool ok = in.read(magic, 8) && std::memcmp(magic, kMagic, 8) == 0 && read_pod(in, &ptx) &&
            read_str(in, &stored_key, 1 << 20) && stored_key == key && read_str(in, &e.lowered_name, 4096) &&
            read_str(in, &image, 1ull << 30) && read_str(in, &sum, 64);
  if (ok) {
    e.image.assign(image.begin(), image.end());
    e.ptx = ptx != 0;
    ok = sum == checksum(key, e) && in.peek() == std::char_traits<char>::eof();
  }
  if (!ok) {
    std::remove(path.c_str());  // corrupt or foreign: recompile and rewrite
    return false;
  }
  *out = std::move(e);
  return true;
}

template <class T>
static void write_pod(std::ostream& out, const T& v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}
static void write_str(std::ostream& out, const std::string& s) {
  write_pod(out, static_cast<uint64_t>(s.size()));
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}

bool DiskCache::store(const std::string& key, const CacheEntry& e) const {
  if (!enabled() || !make_dirs(dir_)) return false;
  std::string path = path_for(key);
  std::random_device rd;
  std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(rd());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out.write(kMagic, 8);
    write_pod(out, static_cast<uint32_t>(e.ptx ? 1 : 0));
    write_str(out, key);
    write_str(out, e.lowered_name);
    write_str(out, std::string(e.image.begin(), e.image.end()));
    write_str(out, checksum(key, e));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace flame
