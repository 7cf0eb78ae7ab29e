// Sticky device faults (issue 12): a kernel that reads an illegal address leaves its context failed,
// clearly reported, and cleanly destroyable; see "Device faults" at the top of flame.h.
//
// The fault is real: a DLPack tensor whose data pointer is device address 256 (the unmapped first
// page), imported with flame_tensor_from_dlpack (which cannot check foreign memory) and read by
// flame_neg. An illegal access poisons the whole CUDA context, and every FLAME context on one GPU
// shares that GPU's primary CUDA context, so the faulting part runs in a child process: the test
// re-executes its own binary (/proc/self/exe) with FLAME_TEST_DEVICE_FAULT_CHILD=1, which a static
// initializer of this file sees before main (no gtest, no CUDA state inherited through fork). The
// child checks, in order:
//   1. contexts A and B on device 0 (and C on device 1 when there is one) work;
//   2. the read through the bogus pointer: the call or the next synchronisation returns
//      FLAME_ERROR_CONTEXT_FAILED with "device fault" in the message;
//   3. later calls on A return FLAME_ERROR_CONTEXT_FAILED (creation, ops, synchronise, copies);
//   4. B (same GPU, same CUDA context) reports FLAME_ERROR_CONTEXT_FAILED at its next device call;
//   5. C (another GPU) either keeps working with correct values or fails cleanly with
//      FLAME_ERROR_CONTEXT_FAILED (drivers differ: on a two-GPU H200 host the fault poisons it too);
//   6. releasing every tensor (the import's deleter runs exactly once) and destroying A and B works;
//   7. a new context on device 0 then works, or (where the driver keeps the fault process-wide or
//      the CUDA runtime still holds the primary context) fails cleanly with FLAME_ERROR_CONTEXT_FAILED.
// It exits 0 when all hold, 1 otherwise (what failed is on its stderr). The parent test checks the
// exit status and that its own context, on the same GPU, works before and after.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include FLAME_DLPACK_HEADER
#include "flame_test.h"

extern char** environ;

namespace {

constexpr const char* kChildEnv = "FLAME_TEST_DEVICE_FAULT_CHILD";
std::atomic<int> g_deleter_calls{0};

int g_failures = 0;
void child_check(bool ok, const std::string& what) {
  std::fprintf(stderr, "[device fault child] %s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}
std::string status_and_message(flame_status_t st) {
  return std::string(flame_status_string(st)) + (st == FLAME_OK ? "" : std::string(" (") + flame_last_error_message() + ")");
}

flame_ctx_t child_context(int device, bool may_be_failed = false) {
  flame_ctx_options_t o;
  flame_ctx_options_init(&o);
  o.device = device;
  flame_ctx_t c = nullptr;
  flame_status_t st = flame_ctx_create(&o, &c);
  const bool clean = st == FLAME_OK ? c != nullptr : (may_be_failed && st == FLAME_ERROR_CONTEXT_FAILED && !c);
  child_check(clean, "create a context on device " + std::to_string(device) + ": " + status_and_message(st));
  return c;
}

// neg of a fresh [1000] tensor of 1.5, read back: FLAME_OK and the right values, or the failing status.
flame_status_t neg_round_trip(flame_ctx_t c, bool* values_ok) {
  *values_ok = false;
  const int64_t shape[] = {1000};
  flame_tensor_t x = nullptr, y = nullptr;
  flame_status_t st = flame_full(c, shape, 1, FLAME_DTYPE_F32, 1.5, &x);
  if (st == FLAME_OK) st = flame_neg(x, &y);
  std::vector<float> v(1000, 0.0f);
  if (st == FLAME_OK) st = flame_to_host(y, v.data(), v.size() * sizeof(float));
  if (st == FLAME_OK) {
    *values_ok = true;
    for (float f : v) *values_ok = *values_ok && f == -1.5f;
  }
  flame_tensor_release(y);
  flame_tensor_release(x);
  return st;
}

// After a fault elsewhere: a context works with the right values or reports the fault cleanly.
void works_or_fails_cleanly(flame_ctx_t c, const std::string& what) {
  bool vals = false;
  flame_status_t st = neg_round_trip(c, &vals);
  child_check((st == FLAME_OK && vals) || st == FLAME_ERROR_CONTEXT_FAILED, what + ": " + status_and_message(st));
}

void counting_deleter(DLManagedTensor* self) {
  g_deleter_calls.fetch_add(1);
  delete[] self->dl_tensor.shape;
  delete self;
}

int child_main() {
  int32_t devices = 0;
  flame_status_t st = flame_device_count(&devices);
  child_check(st == FLAME_OK && devices >= 1, "device count: " + status_and_message(st));
  if (st != FLAME_OK || devices < 1) return 1;

  // 1. healthy contexts
  flame_ctx_t a = child_context(0), b = child_context(0), c = devices > 1 ? child_context(1) : nullptr;
  if (!a || !b || (devices > 1 && !c)) return 1;
  bool vals = false;
  for (flame_ctx_t x : {a, b, c}) {
    if (!x) continue;
    st = neg_round_trip(x, &vals);
    child_check(st == FLAME_OK && vals, "an op works before the fault: " + status_and_message(st));
  }
  const int64_t shape[] = {1000};
  flame_tensor_t a_kept = nullptr, b_kept = nullptr;  // tensors made before the fault, released after it
  flame_full(a, shape, 1, FLAME_DTYPE_F32, 2.0, &a_kept);
  flame_full(b, shape, 1, FLAME_DTYPE_F32, 3.0, &b_kept);
  child_check(a_kept && b_kept, "tensors for later");

  // 2. the fault: 1 Mi floats "at" device address 256
  auto* m = new DLManagedTensor();
  m->dl_tensor.data = reinterpret_cast<void*>(static_cast<uintptr_t>(256));
  m->dl_tensor.device.device_type = kDLCUDA;
  m->dl_tensor.device.device_id = 0;
  m->dl_tensor.ndim = 1;
  m->dl_tensor.dtype.code = kDLFloat;
  m->dl_tensor.dtype.bits = 32;
  m->dl_tensor.dtype.lanes = 1;
  m->dl_tensor.shape = new int64_t[1]{int64_t(1) << 20};
  m->dl_tensor.strides = nullptr;
  m->dl_tensor.byte_offset = 0;
  m->deleter = &counting_deleter;
  flame_tensor_t bogus = nullptr, bad = nullptr;
  st = flame_tensor_from_dlpack(a, m, &bogus);
  child_check(st == FLAME_OK, "import of the bogus pointer (foreign memory is not checked): " + status_and_message(st));
  if (st != FLAME_OK) {
    counting_deleter(m);
    return 1;
  }
  st = flame_neg(bogus, &bad);  // the launch itself usually succeeds; the fault is found at the sync
  if (st == FLAME_OK) st = flame_ctx_synchronize(a);
  std::string msg = flame_last_error_message();
  child_check(st == FLAME_ERROR_CONTEXT_FAILED, "the faulting read reports FLAME_ERROR_CONTEXT_FAILED: " + status_and_message(st));
  child_check(msg.find("device fault") != std::string::npos, "its message says so: " + msg);

  // 3. A stays failed
  flame_tensor_t t = nullptr;
  st = flame_zeros(a, shape, 1, FLAME_DTYPE_F32, &t);
  child_check(st == FLAME_ERROR_CONTEXT_FAILED && !t, "creating on A afterwards: " + status_and_message(st));
  flame_tensor_release(t);
  t = nullptr;
  st = flame_neg(a_kept, &t);
  child_check(st == FLAME_ERROR_CONTEXT_FAILED && !t, "an op on an older tensor of A: " + status_and_message(st));
  flame_tensor_release(t);
  msg = flame_last_error_message();
  child_check(msg.find("earlier device fault") != std::string::npos, "the message names the earlier fault: " + msg);
  std::vector<float> host(1000);
  st = flame_to_host(a_kept, host.data(), host.size() * sizeof(float));
  child_check(st == FLAME_ERROR_CONTEXT_FAILED, "copy from A: " + status_and_message(st));
  st = flame_ctx_synchronize(a);
  child_check(st == FLAME_ERROR_CONTEXT_FAILED, "synchronise A again: " + status_and_message(st));

  // 4. B shares the GPU's CUDA context: its next device call fails, and then it stays failed
  st = flame_to_host(b_kept, host.data(), host.size() * sizeof(float));
  child_check(st == FLAME_ERROR_CONTEXT_FAILED, "B (same GPU) at its next device call: " + status_and_message(st));
  st = neg_round_trip(b, &vals);
  child_check(st == FLAME_ERROR_CONTEXT_FAILED, "B afterwards: " + status_and_message(st));

  // 5. another GPU: untouched where the driver keeps faults per CUDA context
  if (c) works_or_fails_cleanly(c, "C on device 1 works or reports the fault");

  // 6. release everything, then destroy; the import's deleter runs once
  flame_tensor_release(bad);
  flame_tensor_release(bogus);
  child_check(g_deleter_calls.load() == 1, "the import's deleter ran once: " + std::to_string(g_deleter_calls.load()));
  flame_tensor_release(a_kept);
  flame_tensor_release(b_kept);
  flame_ctx_destroy(a);
  flame_ctx_destroy(b);
  child_check(g_deleter_calls.load() == 1, "and only once");

  // 7. every FLAME user of device 0's primary context is gone: a new context there starts afresh
  // where the driver allows it
  flame_ctx_t d = child_context(0, /*may_be_failed=*/true);
  if (d) {
    works_or_fails_cleanly(d, "a new context on device 0 works or reports the fault");
    flame_ctx_destroy(d);
  }
  if (c) {
    works_or_fails_cleanly(c, "C at the end works or reports the fault");
    flame_ctx_destroy(c);
  }
  std::fprintf(stderr, "[device fault child] %d failure(s)\n", g_failures);
  return g_failures == 0 ? 0 : 1;
}

// Runs the child's checks instead of the test program when the parent test started this process.
const bool g_child_ran = [] {
  const char* v = std::getenv(kChildEnv);
  if (v && std::strcmp(v, "1") == 0) {
    std::fflush(stdout);
    int rc = child_main();
    std::fflush(stderr);
    std::_Exit(rc);  // no static destructors, no gtest
  }
  return false;
}();

// Starts /proc/self/exe with kChildEnv=1; returns its exit status, or -1 with *why set.
int run_child(std::string* why) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) { *why = "readlink /proc/self/exe failed"; return -1; }
  exe[n] = '\0';
  std::vector<std::string> env_store;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, kChildEnv, std::strlen(kChildEnv)) != 0) env_store.emplace_back(*e);
  env_store.push_back(std::string(kChildEnv) + "=1");
  std::vector<char*> envp;
  for (auto& s : env_store) envp.push_back(&s[0]);
  envp.push_back(nullptr);
  char* argv[] = {exe, nullptr};
  pid_t pid = 0;
  int err = posix_spawn(&pid, exe, nullptr, nullptr, argv, envp.data());
  if (err != 0) { *why = std::string("posix_spawn: ") + std::strerror(err); return -1; }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) { *why = "waitpid failed"; return -1; }
  if (!WIFEXITED(status)) { *why = "the child died of signal " + std::to_string(WTERMSIG(status)); return -1; }
  return WEXITSTATUS(status);
}

using DeviceFault = GpuTest;

}  // namespace

TEST_F(DeviceFault, IllegalAddressFailsItsContextCleanly) {
  ASSERT_FALSE(g_child_ran);
  bool vals = false;
  flame_status_t st = neg_round_trip(ctx, &vals);
  ASSERT_EQ(st, FLAME_OK) << flame_last_error_message();
  ASSERT_TRUE(vals);
  std::string why;
  int rc = run_child(&why);
  EXPECT_EQ(rc, 0) << (rc < 0 ? why : "the child's checks failed: see its [device fault child] lines above");
  // The parent's context, on the same GPU but in another process (another CUDA context), works.
  st = neg_round_trip(ctx, &vals);
  EXPECT_EQ(st, FLAME_OK) << flame_last_error_message();
  EXPECT_TRUE(vals);
  FLAME_EXPECT_STATUS(flame_ctx_synchronize(ctx), FLAME_OK);
}
