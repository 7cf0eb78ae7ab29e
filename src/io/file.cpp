// POSIX file helpers for model I/O: mmap for reading, temp file + fsync + rename for writing.
#include "io/file.h"
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include "core/error.h"

namespace flame::io {

namespace {

std::string sys_error(int err) {
  char buf[256];
  // GNU strerror_r returns the message (possibly not in buf); thread-safe unlike strerror.
  return strerror_r(err, buf, sizeof buf);
}

std::string dir_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

MappedFile::MappedFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(FLAME_ERROR_IO, "cannot open ", path, ": ", sys_error(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail(FLAME_ERROR_IO, "cannot stat ", path, ": ", sys_error(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(FLAME_ERROR_IO, path, " is not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail(FLAME_ERROR_IO, "cannot map ", path, " (", size_, " bytes): ", sys_error(e));
    }
    addr_ = p;
  }
  ::close(fd);  // the mapping keeps the file open
}

MappedFile::~MappedFile() {
  if (addr_) ::munmap(addr_, size_);
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  FLAME_CHECK(!path_.empty(), FLAME_ERROR_IO, "the path is empty");
  std::random_device rd;
  for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
    char suffix[64];
    std::snprintf(suffix, sizeof suffix, ".tmp-%ld-%08x", static_cast<long>(::getpid()), static_cast<unsigned>(rd()));
    tmp_ = path_ + suffix;
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno != EEXIST) fail(FLAME_ERROR_IO, "cannot create ", tmp_, ": ", sys_error(errno));
  }
  if (fd_ < 0) fail(FLAME_ERROR_IO, "cannot create a temporary file next to ", path_);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail(FLAME_ERROR_IO, "cannot write ", tmp_, ": ", sys_error(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFileWriter::commit() {
  if (::fsync(fd_) != 0) fail(FLAME_ERROR_IO, "cannot flush ", tmp_, " to disk: ", sys_error(errno));
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(FLAME_ERROR_IO, "cannot close ", tmp_, ": ", sys_error(errno));
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    fail(FLAME_ERROR_IO, "cannot rename ", tmp_, " to ", path_, ": ", sys_error(errno));
  committed_ = true;
  // Make the rename itself durable; a failure here leaves a complete file, so it is not reported.
  int dir = ::open(dir_of(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

}  // namespace flame::io
