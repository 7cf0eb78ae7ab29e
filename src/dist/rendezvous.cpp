// The TCP rendezvous of rendezvous.h. Wire format (integers big-endian):
//   hello, rank r -> rank 0: "FLMRDZV1" | u32 version | i32 rank | i32 world_size   (20 bytes)
//   answer, rank 0 -> rank r: u8 kind (0 ok, 1 failed) | u32 length | payload
//     ok: the 128 id bytes; failed: the failure message (at most 4096 bytes).
#include "dist/rendezvous.h"
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <vector>
#include "core/error.h"

namespace flame {
namespace {

constexpr char kMagic[8] = {'F', 'L', 'M', 'R', 'D', 'Z', 'V', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHelloBytes = 20;
constexpr uint8_t kAnswerOk = 0, kAnswerFailed = 1;
constexpr uint32_t kMaxMessage = 4096;
constexpr int kHelloWaitMs = 2000;    // a connected client must say hello within this
constexpr int kRetryMs = 50;          // pause between connection attempts to rank 0
constexpr double kVerdictGraceS = 5;  // a connected rank waits this past its deadline for rank 0

using Clock = std::chrono::steady_clock;

// An owned socket: closed exactly once on every path.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }
  int fd() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

struct AddrInfoFree {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using AddrList = std::unique_ptr<addrinfo, AddrInfoFree>;

std::string endpoint(const RendezvousPeer& p) {
  bool v6 = p.master_addr.find(':') != std::string::npos;
  return (v6 ? "[" + p.master_addr + "]" : p.master_addr) + ":" + std::to_string(p.master_port);
}

Clock::duration seconds(double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); }

int ms_until(Clock::time_point t) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

std::string seconds_text(double s) {
  std::ostringstream o;
  o << s << " s";
  return o.str();
}

AddrList resolve(const RendezvousPeer& p, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* list = nullptr;
  std::string port = std::to_string(p.master_port);
  int rc = getaddrinfo(p.master_addr.c_str(), port.c_str(), &hints, &list);
  FLAME_CHECK(rc == 0 && list, FLAME_ERROR_IO, "rendezvous at ", endpoint(p), ": cannot resolve '", p.master_addr,
              "': ", rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc));
  return AddrList(list);
}

void set_nonblocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags >= 0) fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void no_sigpipe(int fd) {
#ifdef SO_NOSIGPIPE
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#else
  (void)fd;
#endif
}

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0
#endif

// Sends all of data before the deadline; false on error or timeout.
bool send_all(int fd, const uint8_t* data, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    ssize_t k = ::send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      data += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      int remaining = ms_until(deadline);
      if (remaining == 0 || ::poll(&pf, 1, remaining) <= 0) return false;
      continue;
    }
    return false;
  }
  return true;
}

enum class RecvResult { kOk, kClosed, kTimeout, kError };

RecvResult recv_all(int fd, uint8_t* data, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    int ready = ::poll(&pf, 1, ms_until(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return RecvResult::kError;
    if (ready == 0) return RecvResult::kTimeout;
    ssize_t k = ::recv(fd, data, n, MSG_DONTWAIT);
    if (k == 0) return RecvResult::kClosed;
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return RecvResult::kError;
    }
    data += k;
    n -= static_cast<size_t>(k);
  }
  return RecvResult::kOk;
}

void put_u32(uint8_t* p, uint32_t v) {
  uint32_t be = htonl(v);
  std::memcpy(p, &be, 4);
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t be;
  std::memcpy(&be, p, 4);
  return ntohl(be);
}

std::vector<uint8_t> answer_frame(uint8_t kind, const uint8_t* payload, size_t n) {
  std::vector<uint8_t> f(5 + n);
  f[0] = kind;
  put_u32(f.data() + 1, static_cast<uint32_t>(n));
  if (n) std::memcpy(f.data() + 5, payload, n);
  return f;
}

// Best effort: tells a client why it was refused (it fails with this message).
void send_failure(int fd, const std::string& message) {
  std::string m = message.substr(0, kMaxMessage);
  auto f = answer_frame(kAnswerFailed, reinterpret_cast<const uint8_t*>(m.data()), m.size());
  send_all(fd, f.data(), f.size(), Clock::now() + std::chrono::milliseconds(500));
}

// ---------------- rank 0 ----------------

Socket listen_on(const RendezvousPeer& p) {
  AddrList list = resolve(p, true);
  std::string last_error = "no address";
  for (addrinfo* a = list.get(); a; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (s.fd() < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    int one = 1;
    setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(s.fd(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(s.fd(), std::min(p.world_size + 16, 4096)) != 0) {
      last_error = std::strerror(errno);
      continue;
    }
    set_nonblocking(s.fd(), true);
    return s;
  }
  fail(FLAME_ERROR_IO, "rendezvous at ", endpoint(p), ": rank 0 cannot listen there (", last_error,
       "; MASTER_ADDR must be an address of rank 0's host and MASTER_PORT free)");
}

// A connection that has not yet said a complete hello.
struct Pending {
  Socket sock;
  uint8_t hello[kHelloBytes] = {};
  size_t got = 0;
  Clock::time_point hello_deadline;
};

class Host {
 public:
  Host(const RendezvousPeer& p, const RendezvousId& id) : p_(p), id_(id), arrived_(static_cast<size_t>(p.world_size)) {}

  void run() {
    Socket listener = listen_on(p_);
    auto deadline = Clock::now() + seconds(p_.timeout_seconds);
    while (count_arrived() < p_.world_size - 1) {
      auto wake = deadline;
      for (auto& c : pending_) wake = std::min(wake, c.hello_deadline);
      std::vector<pollfd> fds{{listener.fd(), POLLIN, 0}};
      for (auto& c : pending_) fds.push_back({c.sock.fd(), POLLIN, 0});
      int ready = ::poll(fds.data(), fds.size(), ms_until(wake));
      if (ready < 0 && errno != EINTR) fail(FLAME_ERROR_IO, "rendezvous at ", endpoint(p_), ": poll: ", std::strerror(errno));
      if (ready > 0) {
        for (size_t i = fds.size() - 1; i >= 1; --i)
          if (fds[i].revents) read_hello(i - 1);
        if (fds[0].revents & POLLIN) accept_all(listener.fd());
      }
      drop_silent_clients();
      if (Clock::now() >= deadline && count_arrived() < p_.world_size - 1) fail_missing();
    }
    auto ok = answer_frame(kAnswerOk, id_.data(), id_.size());
    auto send_deadline = Clock::now() + seconds(std::max(p_.timeout_seconds, 1.0));
    for (int32_t r = 1; r < p_.world_size; ++r)
      FLAME_CHECK(send_all(arrived_[r].fd(), ok.data(), ok.size(), send_deadline), FLAME_ERROR_IO, "rendezvous at ",
                  endpoint(p_), ": cannot send the id to rank ", r, ": ", std::strerror(errno));
  }

 private:
  int32_t count_arrived() const {
    return static_cast<int32_t>(std::count_if(arrived_.begin(), arrived_.end(), [](const Socket& s) { return s.fd() >= 0; }));
  }

  void accept_all(int listener) {
    for (;;) {
      Socket s(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (s.fd() < 0) return;  // EAGAIN: none left (or a transient error: poll again)
      no_sigpipe(s.fd());
      int one = 1;
      setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      Pending c;
      c.sock = std::move(s);
      c.hello_deadline = Clock::now() + std::chrono::milliseconds(kHelloWaitMs);
      pending_.push_back(std::move(c));
    }
  }

  void read_hello(size_t i) {
    Pending& c = pending_[i];
    ssize_t k = ::recv(c.sock.fd(), c.hello + c.got, kHelloBytes - c.got, MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (k <= 0) {  // closed or broken before a whole hello: not one of ours
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
    c.got += static_cast<size_t>(k);
    if (c.got < kHelloBytes) return;
    Socket s = std::move(c.sock);
    uint8_t hello[kHelloBytes];
    std::memcpy(hello, c.hello, kHelloBytes);
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    admit(std::move(s), hello);
  }

  // Checks a complete hello: a foreign client is dropped; a wrong rank is told why.
  void admit(Socket s, const uint8_t* hello) {
    if (std::memcmp(hello, kMagic, sizeof kMagic) != 0) return;  // not a FLAME rendezvous client
    uint32_t version = get_u32(hello + 8);
    auto rank = static_cast<int32_t>(get_u32(hello + 12));
    auto world = static_cast<int32_t>(get_u32(hello + 16));
    std::string refusal;
    if (version != kVersion) {
      refusal = "protocol version " + std::to_string(version) + " is not rank 0's " + std::to_string(kVersion);
    } else if (world != p_.world_size) {
      refusal = "rank " + std::to_string(rank) + " has world_size " + std::to_string(world) + " but rank 0 has " +
                std::to_string(p_.world_size);
    } else if (rank < 1 || rank >= p_.world_size) {
      refusal = "rank " + std::to_string(rank) + " is not in [1, " + std::to_string(p_.world_size) + ")";
    } else if (arrived_[rank].fd() >= 0) {
      refusal = "rank " + std::to_string(rank) + " arrived twice";
    }
    if (!refusal.empty()) {
      std::string m = "rendezvous at " + endpoint(p_) + ": rank 0 refused a client: " + refusal;
      send_failure(s.fd(), m);
      refusals_.push_back(refusal);
      return;
    }
    arrived_[rank] = std::move(s);
  }

  void drop_silent_clients() {
    auto now = Clock::now();
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [&](const Pending& c) { return now >= c.hello_deadline; }),
                   pending_.end());
  }

  [[noreturn]] void fail_missing() {
    std::vector<int32_t> missing;
    for (int32_t r = 1; r < p_.world_size; ++r)
      if (arrived_[r].fd() < 0) missing.push_back(r);
    std::ostringstream m;
    m << "rendezvous at " << endpoint(p_) << ": rank" << (missing.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < missing.size(); ++i) m << (i ? ", " : "") << missing[i];
    m << " of " << p_.world_size << " did not arrive within "
      << seconds_text(p_.timeout_seconds);
    if (!refusals_.empty()) {
      m << " (refused:";
      for (size_t i = 0; i < refusals_.size() && i < 8; ++i) m << (i ? "; " : " ") << refusals_[i];
      m << ")";
    }
    std::string message = m.str();
    for (int32_t r = 1; r < p_.world_size; ++r)
      if (arrived_[r].fd() >= 0) send_failure(arrived_[r].fd(), message);
    fail(FLAME_ERROR_IO, message);
  }

  const RendezvousPeer& p_;
  const RendezvousId& id_;
  std::vector<Socket> arrived_;  // by rank; rank 0's slot stays empty
  std::vector<Pending> pending_;
  std::vector<std::string> refusals_;
};

// ---------------- ranks 1.. ----------------

// Connects to rank 0, retrying until the deadline; the last error names why.
Socket connect_to_host(const RendezvousPeer& p, Clock::time_point deadline) {
  std::string last_error = "timed out";
  for (;;) {
    AddrList list = resolve(p, false);
    for (addrinfo* a = list.get(); a; a = a->ai_next) {
      Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
      if (s.fd() < 0) {
        last_error = std::strerror(errno);
        continue;
      }
      no_sigpipe(s.fd());
      int rc = ::connect(s.fd(), a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd pf{s.fd(), POLLOUT, 0};
        int ready = ::poll(&pf, 1, ms_until(deadline));
        int err = ETIMEDOUT;
        socklen_t len = sizeof err;
        if (ready > 0) getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      }
      if (rc == 0) return s;
      last_error = std::strerror(errno);
    }
    if (ms_until(deadline) <= kRetryMs) break;
    ::poll(nullptr, 0, kRetryMs);
  }
  fail(FLAME_ERROR_IO, "rendezvous at ", endpoint(p), ": rank ", p.rank, " could not reach rank 0 within ",
       seconds_text(p.timeout_seconds), " (last error: ", last_error, ")");
}

RendezvousId join(const RendezvousPeer& p) {
  auto deadline = Clock::now() + seconds(p.timeout_seconds);
  Socket s = connect_to_host(p, deadline);
  uint8_t hello[kHelloBytes];
  std::memcpy(hello, kMagic, sizeof kMagic);
  put_u32(hello + 8, kVersion);
  put_u32(hello + 12, static_cast<uint32_t>(p.rank));
  put_u32(hello + 16, static_cast<uint32_t>(p.world_size));
  std::string where = "rendezvous at " + endpoint(p) + ": rank " + std::to_string(p.rank);
  FLAME_CHECK(send_all(s.fd(), hello, sizeof hello, deadline), FLAME_ERROR_IO, where, " could not send its hello to rank 0");
  // Rank 0's clock started on its own: give it a grace to send its verdict past this rank's deadline.
  auto verdict_deadline = deadline + seconds(kVerdictGraceS);
  uint8_t head[5];
  auto describe = [&](RecvResult r) -> std::string {
    if (r == RecvResult::kClosed) return " lost the connection to rank 0 (rank 0 failed or exited)";
    if (r == RecvResult::kTimeout) return " got no answer from rank 0 within " + seconds_text(p.timeout_seconds + kVerdictGraceS);
    return std::string(" lost the connection to rank 0: ") + std::strerror(errno);
  };
  RecvResult r = recv_all(s.fd(), head, sizeof head, verdict_deadline);
  FLAME_CHECK(r == RecvResult::kOk, FLAME_ERROR_IO, where, describe(r));
  uint32_t n = get_u32(head + 1);
  if (head[0] == kAnswerOk) {
    FLAME_CHECK(n == kRendezvousIdBytes, FLAME_ERROR_IO, where, ": rank 0 sent a malformed answer");
    RendezvousId id;
    r = recv_all(s.fd(), id.data(), id.size(), verdict_deadline);
    FLAME_CHECK(r == RecvResult::kOk, FLAME_ERROR_IO, where, describe(r));
    return id;
  }
  FLAME_CHECK(head[0] == kAnswerFailed && n <= kMaxMessage, FLAME_ERROR_IO, where, ": rank 0 sent a malformed answer");
  std::string message(n, '\0');
  r = recv_all(s.fd(), reinterpret_cast<uint8_t*>(&message[0]), n, verdict_deadline);
  FLAME_CHECK(r == RecvResult::kOk, FLAME_ERROR_IO, where, describe(r));
  fail(FLAME_ERROR_IO, message, " (seen by rank ", p.rank, ")");
}

}  // namespace

RendezvousId rendezvous_exchange(const RendezvousPeer& p, const RendezvousId& id) {
  FLAME_CHECK(!p.master_addr.empty(), FLAME_ERROR_INVALID_ARGUMENT, "master_addr is empty");
  FLAME_CHECK(p.master_port >= 1 && p.master_port <= 65535, FLAME_ERROR_INVALID_ARGUMENT, "master_port ", p.master_port,
              " is not in [1, 65535]");
  FLAME_CHECK(p.world_size >= 1, FLAME_ERROR_INVALID_ARGUMENT, "world_size ", p.world_size, " is below 1");
  FLAME_CHECK(p.rank >= 0 && p.rank < p.world_size, FLAME_ERROR_INVALID_ARGUMENT, "rank ", p.rank, " is not in [0, ",
              p.world_size, ")");
  FLAME_CHECK(p.timeout_seconds > 0 && p.timeout_seconds <= 86400, FLAME_ERROR_INVALID_ARGUMENT, "timeout_seconds ",
              p.timeout_seconds, " is not in (0, 86400]");
  if (p.world_size == 1) return id;
  if (p.rank != 0) return join(p);
  Host(p, id).run();
  return id;
}

}  // namespace flame
