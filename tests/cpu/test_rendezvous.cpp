// flame_comm_rendezvous between real processes on the loopback address: each rank is a fork()ed
// child that calls the C API, counts its open fds before and after, writes its result to a pipe and
// _exit()s (it never returns into gtest). Timeouts are short (1-2 s) so the suite stays fast.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include <gtest/gtest.h>
#include "flame.h"

namespace {

struct RankResult {
  int32_t status = -1;
  int32_t fds_unchanged = 0;
  flame_comm_id_t id{};
  char message[1024] = {};
};

struct RankSpec {
  int32_t rank;
  int32_t world_size;
  double timeout_seconds;
};

int count_open_fds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}

flame_comm_id_t pattern_id() {
  flame_comm_id_t id;
  for (int i = 0; i < FLAME_COMM_ID_BYTES; ++i) id.internal[i] = static_cast<uint8_t>(i * 7 + 3);
  return id;
}

int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  close(s);
  return ntohs(a.sin_port);
}

struct Child {
  pid_t pid;
  int read_fd;
};

// Forks one rank: rank 0 offers pattern_id(), the others start from zeros.
Child start_rank(int port, const RankSpec& spec) {
  int fds[2];
  if (pipe(fds) != 0) std::abort();
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    RankResult r;
    flame_comm_id_t id = spec.rank == 0 ? pattern_id() : flame_comm_id_t{};
    int before = count_open_fds();
    r.status = flame_comm_rendezvous("127.0.0.1", port, spec.rank, spec.world_size, spec.timeout_seconds, &id);
    r.fds_unchanged = count_open_fds() == before;
    r.id = id;
    std::snprintf(r.message, sizeof r.message, "%s", flame_last_error_message());
    ssize_t ignored = write(fds[1], &r, sizeof r);
    (void)ignored;
    _exit(0);
  }
  close(fds[1]);
  return {pid, fds[0]};
}

RankResult finish(const Child& c) {
  RankResult r;
  size_t got = 0;
  auto* p = reinterpret_cast<char*>(&r);
  while (got < sizeof r) {
    ssize_t k = read(c.read_fd, p + got, sizeof r - got);
    if (k <= 0) break;
    got += static_cast<size_t>(k);
  }
  close(c.read_fd);
  int wstatus = 0;
  waitpid(c.pid, &wstatus, 0);
  if (got != sizeof r) std::snprintf(r.message, sizeof r.message, "child %d died without a result", c.pid);
  return r;
}

std::vector<RankResult> run_ranks(int port, const std::vector<RankSpec>& specs) {
  std::vector<Child> children;
  for (const auto& s : specs) children.push_back(start_rank(port, s));
  std::vector<RankResult> results;
  for (const auto& c : children) results.push_back(finish(c));
  return results;
}

bool same_id(const flame_comm_id_t& a, const flame_comm_id_t& b) {
  return std::memcmp(a.internal, b.internal, sizeof a.internal) == 0;
}

bool contains(const char* text, const std::string& part) { return std::string(text).find(part) != std::string::npos; }

TEST(Rendezvous, FourRanksAllGetRankZerosId) {
  int port = free_port();
  auto results = run_ranks(port, {{0, 4, 10}, {1, 4, 10}, {2, 4, 10}, {3, 4, 10}});
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].status, FLAME_OK) << "rank " << r << ": " << results[r].message;
    EXPECT_TRUE(same_id(results[r].id, pattern_id())) << "rank " << r;
    EXPECT_TRUE(results[r].fds_unchanged) << "rank " << r;
  }
}

TEST(Rendezvous, MissingRankIsNamedOnEveryRank) {
  int port = free_port();
  auto start = std::chrono::steady_clock::now();
  auto results = run_ranks(port, {{0, 4, 2}, {1, 4, 2}, {2, 4, 2}});  // rank 3 never starts
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(elapsed, 6.0);
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].status, FLAME_ERROR_IO) << "rank " << r;
    EXPECT_TRUE(contains(results[r].message, "rank 3 of 4 did not arrive within 2 s")) << results[r].message;
    EXPECT_TRUE(contains(results[r].message, "127.0.0.1:" + std::to_string(port))) << results[r].message;
    EXPECT_TRUE(results[r].fds_unchanged) << "rank " << r;
  }
  flame_comm_id_t zeros{};
  EXPECT_TRUE(same_id(results[0].id, pattern_id()));  // rank 0's input stays
  EXPECT_TRUE(same_id(results[1].id, zeros));
}

TEST(Rendezvous, AbsentRankZeroIsNamedByTheOthers) {
  int port = free_port();
  auto results = run_ranks(port, {{1, 3, 1}, {2, 3, 1}});
  for (const auto& r : results) {
    EXPECT_EQ(r.status, FLAME_ERROR_IO);
    EXPECT_TRUE(contains(r.message, "127.0.0.1:" + std::to_string(port))) << r.message;
    EXPECT_TRUE(contains(r.message, "could not reach rank 0 within 1 s")) << r.message;
    EXPECT_TRUE(r.fds_unchanged);
  }
}

TEST(Rendezvous, WorldSizeMismatchIsRefused) {
  int port = free_port();
  auto results = run_ranks(port, {{0, 2, 1.5}, {1, 3, 1.5}});
  EXPECT_EQ(results[1].status, FLAME_ERROR_IO);
  EXPECT_TRUE(contains(results[1].message, "rank 1 has world_size 3 but rank 0 has 2")) << results[1].message;
  EXPECT_EQ(results[0].status, FLAME_ERROR_IO);
  EXPECT_TRUE(contains(results[0].message, "rank 1 of 2 did not arrive")) << results[0].message;
  EXPECT_TRUE(contains(results[0].message, "world_size 3")) << results[0].message;
  for (const auto& r : results) EXPECT_TRUE(r.fds_unchanged);
}

TEST(Rendezvous, DuplicateRankIsRefusedAndTheRestComplete) {
  int port = free_port();
  // Rank 2 starts only once one of the two rank 1s has its answer (the refusal), so that rank 0
  // cannot complete (and stop listening) before it has seen both.
  std::vector<Child> children{start_rank(port, {0, 3, 5}), start_rank(port, {1, 3, 5}), start_rank(port, {1, 3, 5})};
  pollfd twins[2] = {{children[1].read_fd, POLLIN, 0}, {children[2].read_fd, POLLIN, 0}};
  EXPECT_GT(poll(twins, 2, 5000), 0);
  children.push_back(start_rank(port, {2, 3, 5}));
  std::vector<RankResult> results;
  for (const auto& c : children) results.push_back(finish(c));
  int refused = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_TRUE(results[i].fds_unchanged) << i;
    if (results[i].status == FLAME_OK) {
      EXPECT_TRUE(same_id(results[i].id, pattern_id())) << i;
    } else {
      ++refused;
      EXPECT_EQ(results[i].status, FLAME_ERROR_IO);
      EXPECT_TRUE(contains(results[i].message, "rank 1 arrived twice")) << results[i].message;
    }
  }
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(results[0].status, FLAME_OK) << results[0].message;
}

// A foreign client (garbage instead of a hello) is dropped; the real ranks still complete.
TEST(Rendezvous, ForeignClientIsIgnored) {
  int port = free_port();
  Child host = start_rank(port, {0, 2, 5});
  int s = -1;
  for (int attempt = 0; attempt < 200 && s < 0; ++attempt) {
    s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close(s);
      s = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ASSERT_GE(s, 0) << "rank 0 never listened";
  const char garbage[] = "GET / HTTP/1.0\r\nHost: x\r\n\r\n";
  ASSERT_GT(send(s, garbage, sizeof garbage, MSG_NOSIGNAL), 0);
  Child peer = start_rank(port, {1, 2, 5});
  RankResult r0 = finish(host), r1 = finish(peer);
  close(s);
  EXPECT_EQ(r0.status, FLAME_OK) << r0.message;
  EXPECT_EQ(r1.status, FLAME_OK) << r1.message;
  EXPECT_TRUE(same_id(r1.id, pattern_id()));
  EXPECT_TRUE(r0.fds_unchanged && r1.fds_unchanged);
}

TEST(Rendezvous, ArgumentsAreChecked) {
  flame_comm_id_t id = pattern_id();
  EXPECT_EQ(flame_comm_rendezvous("127.0.0.1", 1, 0, 1, 1, &id), FLAME_OK);  // world_size 1: no network
  EXPECT_TRUE(same_id(id, pattern_id()));
  EXPECT_EQ(flame_comm_rendezvous(nullptr, 1, 0, 1, 1, &id), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flame_comm_rendezvous("127.0.0.1", 1, 0, 1, 1, nullptr), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flame_comm_rendezvous("127.0.0.1", 0, 0, 2, 1, &id), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flame_comm_rendezvous("127.0.0.1", 70000, 0, 2, 1, &id), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flame_comm_rendezvous("127.0.0.1", 1, 0, 2, 0, &id), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flame_comm_rendezvous("", 1, 0, 2, 1, &id), FLAME_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(same_id(id, pattern_id()));  // rank 0's id is never changed
  EXPECT_TRUE(contains(flame_last_error_message(), "master_addr is empty")) << flame_last_error_message();
  EXPECT_EQ(flame_comm_rendezvous("127.0.0.1", 1, 2, 2, 1, &id), FLAME_ERROR_INVALID_ARGUMENT);
  flame_comm_id_t zeros{};
  EXPECT_TRUE(same_id(id, zeros));  // not rank 0: the OUT id is zeroed on failure
}

}  // namespace
