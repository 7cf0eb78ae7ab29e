// Persistent cubin cache. One file per kernel under the cache directory, named by the digest of
// its key (source digest, name expression, options, NVRTC version, architecture). A file holds a
// magic, the full key, the lowered name, the image and a checksum; any mismatch counts as a miss
// and the file is replaced. Writes go to a temporary file that is renamed into place, so readers
// never see half a file, even with several processes sharing the directory.
#pragma once
#include <string>
#include <vector>

namespace flame {

struct CacheEntry {
  std::string lowered_name;
  std::vector<char> image;
  bool ptx = false;
};

class DiskCache {
 public:
  // dir "" disables the cache.
  explicit DiskCache(std::string dir) : dir_(std::move(dir)) {}
  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }
  std::string path_for(const std::string& key) const;
  // True and *out filled on a valid entry; false on a miss or a corrupt entry (which is removed).
  bool load(const std::string& key, CacheEntry* out) const;
  // Best effort: a cache that cannot be written is not an error. Returns whether it was written.
  bool store(const std::string& key, const CacheEntry& entry) const;

  // The directory for an option value: the option if not NULL, else $FLAME_KERNEL_CACHE_DIR,
  // else $XDG_CACHE_HOME/flame/kernels, else $HOME/.cache/flame/kernels, else "" (disabled).
  static std::string resolve_dir(const char* option);

 private:
  std::string dir_;
};

}  // namespace flame
