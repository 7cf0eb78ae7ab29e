// Files for model I/O (POSIX): a read-only memory mapping of a whole file, and a writer that
// replaces a file atomically (temporary file in the same directory, fsync, rename). Errors throw
// flame::Error with FLAME_ERROR_IO and a message naming the path and the system's reason.
#pragma once
#include <cstddef>
#include <string>

namespace flame::io {

// The whole file at path, mapped read-only (MAP_PRIVATE). An empty file maps to data() == nullptr.
// As with any mapping, truncating the file while it is mapped makes reads fault (SIGBUS): callers
// document that files must not be shrunk in place while open.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const unsigned char* data() const { return static_cast<const unsigned char*>(addr_); }
  size_t size() const { return size_; }

 private:
  void* addr_ = nullptr;
  size_t size_ = 0;
};

// Writes a new file that appears at path only when commit() succeeds: until then the bytes go to
// "<path>.tmp-<pid>-<random>" (created with O_EXCL, mode 0666 less the umask). commit() flushes it
// to disk, renames it over path and syncs the directory. Destroyed without a successful commit()
// (an error on the way), it closes and removes the temporary file, leaving path as it was.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  void write(const void* data, size_t n);
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace flame::io
