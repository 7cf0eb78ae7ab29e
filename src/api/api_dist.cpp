// C entry points of the distributed section (dist/comm.h, dist/data_parallel.h). Handles own a
// shared Comm / DataParallel; a released handle is emptied and parked in its context's
// dead_objects (as loss scalers), so that passing it again reports FLAME_ERROR_INVALID_HANDLE
// while the context lives. Every call locks the communicator's context; waits inside hold that
// lock (a context serves one rank).
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include "api/guard.h"
#include "api/toolkit_args.h"
#include "dist/data_parallel.h"
#include "dist/launch_env.h"
#include "dist/rendezvous.h"
#include "api/params_list.h"
#include "models/param_sharding.h"
#include "toolkit/zero.h"
#include "toolkit/zero_checkpoint.h"

using namespace flame;

constexpr uint64_t kCommMagic = 0xF1A3EC0330000001ull;
constexpr uint64_t kDpMagic = 0xF1A3ED9A00000001ull;
constexpr uint64_t kZeroMagic = 0xF1A3E2E700000001ull;

struct flame_comm_s {
  uint64_t magic;
  std::shared_ptr<Comm> c;
};

struct flame_dp_s {
  uint64_t magic;
  std::shared_ptr<DataParallel> d;
};

struct flame_zero_s {
  uint64_t magic;
  std::shared_ptr<ZeroOptimizer> z;
  std::shared_ptr<models::ParamSharding> sharding;  // stage 3 only
};

namespace {

static_assert(sizeof(flame_comm_id_t) == sizeof(ncclUniqueId), "flame_comm_id_t holds an ncclUniqueId");

Comm& unwrap_comm(flame_comm_t c) {
  FLAME_CHECK(c, FLAME_ERROR_INVALID_ARGUMENT, "comm is NULL");
  FLAME_CHECK(c->magic == kCommMagic && c->c, FLAME_ERROR_INVALID_HANDLE, "comm is not a live communicator (released already?)");
  return *c->c;
}

DataParallel& unwrap_dp(flame_dp_t d) {
  FLAME_CHECK(d, FLAME_ERROR_INVALID_ARGUMENT, "dp is NULL");
  FLAME_CHECK(d->magic == kDpMagic && d->d, FLAME_ERROR_INVALID_HANDLE, "dp is not a live data-parallel helper (released already?)");
  return *d->d;
}

ZeroOptimizer& unwrap_zero(flame_zero_t z) {
  FLAME_CHECK(z, FLAME_ERROR_INVALID_ARGUMENT, "zero is NULL");
  FLAME_CHECK(z->magic == kZeroMagic && z->z, FLAME_ERROR_INVALID_HANDLE, "zero is not a live ZeRO helper (released already?)");
  return *z->z;
}

// Parks an emptied handle in its context, as flame_grad_scaler_release does.
template <class H>
void park(Context& ctx, H* h) {
  try {
    ctx.dead_objects.push_back(std::shared_ptr<H>(h));
    if (ctx.dead_objects.size() > 4096) ctx.dead_objects.pop_front();
  } catch (...) {  // out of host memory: shared_ptr's constructor deleted the handle
  }
}

flame_comm_options_t comm_options(const flame_comm_options_t* opts) {
  flame_comm_options_t o;
  flame_comm_options_init(&o);
  if (opts) {  // read only what the caller's (possibly older, smaller) struct holds
    FLAME_CHECK(opts->struct_size >= sizeof(size_t) && opts->struct_size <= 4096, FLAME_ERROR_INVALID_ARGUMENT,
                "opts->struct_size is ", opts->struct_size, "; set it with flame_comm_options_init");
    std::memcpy(&o, opts, std::min(opts->struct_size, sizeof o));
    o.struct_size = sizeof o;
  }
  FLAME_CHECK(o.timeout_ms >= 1 && o.timeout_ms <= (int64_t{1} << 40), FLAME_ERROR_INVALID_ARGUMENT, "opts->timeout_ms ",
              o.timeout_ms, " is not in [1, 2^40]");
  return o;
}

const char* process_env(const char* name) { return std::getenv(name); }

// The launch environment's rank must drive the GPU its LOCAL_RANK names; a process that sees a
// single GPU (CUDA_VISIBLE_DEVICES narrowed per rank, as Slurm and some launchers do) drives device 0.
void check_device_matches(Context& c, const LaunchEnv& e) {
  int count = 0;
  c.check(c.drv.cuDeviceGetCount(&count), "cuDeviceGetCount");
  const int expected = count == 1 ? 0 : e.local_rank;
  FLAME_CHECK(c.ordinal == expected, FLAME_ERROR_INVALID_ARGUMENT, "ctx is on device ", c.ordinal, " but LOCAL_RANK=",
              e.local_rank, " (of ", count, " visible devices) asks for device ", expected,
              ": create the context with flame_ctx_options_t.device = LOCAL_RANK (flame_comm_env_local_rank)");
}

}  // namespace

extern "C" {

FLAME_API flame_status_t flame_comm_options_init(flame_comm_options_t* opts) {
  return api_call("flame_comm_options_init", [&] {
    FLAME_CHECK(opts, FLAME_ERROR_INVALID_ARGUMENT, "opts is NULL");
    *opts = flame_comm_options_t{};
    opts->struct_size = sizeof *opts;
    opts->timeout_ms = 600000;
  });
}

FLAME_API flame_status_t flame_comm_unique_id(flame_ctx_t ctx, flame_comm_id_t* id) {
  if (id) std::memset(id, 0, sizeof *id);
  return api_call("flame_comm_unique_id", [&] {
    Context& c = context_of(ctx);
    FLAME_CHECK(id, FLAME_ERROR_INVALID_ARGUMENT, "id is NULL");
    LiveScope scope(c);
    ncclUniqueId u = Comm::unique_id();
    std::memcpy(id->internal, &u, sizeof u);
  });
}

FLAME_API flame_status_t flame_comm_rendezvous(const char* master_addr, int32_t master_port, int32_t rank,
                                               int32_t world_size, double timeout_seconds, flame_comm_id_t* id) {
  flame_status_t st = api_call("flame_comm_rendezvous", [&] {
    FLAME_CHECK(master_addr, FLAME_ERROR_INVALID_ARGUMENT, "master_addr is NULL");
    FLAME_CHECK(id, FLAME_ERROR_INVALID_ARGUMENT, "id is NULL");
    RendezvousId bytes;
    std::memcpy(bytes.data(), id->internal, bytes.size());
    RendezvousPeer peer{master_addr, master_port, rank, world_size, timeout_seconds};
    RendezvousId got = rendezvous_exchange(peer, bytes);
    std::memcpy(id->internal, got.data(), got.size());
  });
  if (st != FLAME_OK && id && rank != 0) std::memset(id, 0, sizeof *id);  // rank 0's input stays
  return st;
}

FLAME_API flame_status_t flame_comm_create(flame_ctx_t ctx, const flame_comm_id_t* id, int32_t rank, int32_t world_size,
                                           const flame_comm_options_t* opts, flame_comm_t* out) {
  return api_call("flame_comm_create", [&] {
    out_param(out, "out");
    Context& c = context_of(ctx);
    FLAME_CHECK(id, FLAME_ERROR_INVALID_ARGUMENT, "id is NULL");
    FLAME_CHECK(world_size >= 1, FLAME_ERROR_INVALID_ARGUMENT, "world_size ", world_size, " is below 1");
    FLAME_CHECK(rank >= 0 && rank < world_size, FLAME_ERROR_INVALID_ARGUMENT, "rank ", rank, " is not in [0, ", world_size, ")");
    flame_comm_options_t o = comm_options(opts);
    LiveScope scope(c);
    ncclUniqueId u;
    std::memcpy(&u, id->internal, sizeof u);
    *out = new flame_comm_s{kCommMagic, Comm::create(c, u, rank, world_size, o.timeout_ms)};
  });
}

FLAME_API flame_status_t flame_comm_env_local_rank(int32_t* local_rank) {
  if (local_rank) *local_rank = 0;
  return api_call("flame_comm_env_local_rank", [&] {
    FLAME_CHECK(local_rank, FLAME_ERROR_INVALID_ARGUMENT, "local_rank is NULL");
    *local_rank = read_launch_env(process_env).local_rank;
  });
}

FLAME_API flame_status_t flame_comm_create_from_env(flame_ctx_t ctx, const flame_comm_options_t* opts, flame_comm_t* out) {
  return api_call("flame_comm_create_from_env", [&] {
    out_param(out, "out");
    Context& c = context_of(ctx);
    flame_comm_options_t o = comm_options(opts);
    const LaunchEnv e = read_launch_env(process_env);
    LiveScope scope(c);
    check_device_matches(c, e);
    RendezvousId bytes{};
    if (e.rank == 0) {
      ncclUniqueId u = Comm::unique_id();
      std::memcpy(bytes.data(), &u, sizeof u);
    }
    RendezvousPeer peer{e.master_addr, e.master_port, e.rank, e.world_size, e.rendezvous_timeout_seconds};
    bytes = rendezvous_exchange(peer, bytes);
    ncclUniqueId u;
    std::memcpy(&u, bytes.data(), sizeof u);
    *out = new flame_comm_s{kCommMagic, Comm::create(c, u, e.rank, e.world_size, o.timeout_ms)};
  });
}

FLAME_API flame_status_t flame_comm_create_group(const flame_ctx_t* ctxs, int32_t n, const flame_comm_options_t* opts,
                                                 flame_comm_t* comms) {
  if (comms && n > 0)
    for (int32_t i = 0; i < n; ++i) comms[i] = nullptr;
  return api_call("flame_comm_create_group", [&] {
    FLAME_CHECK(ctxs, FLAME_ERROR_INVALID_ARGUMENT, "ctxs is NULL");
    FLAME_CHECK(comms, FLAME_ERROR_INVALID_ARGUMENT, "comms is NULL");
    FLAME_CHECK(n >= 1 && n <= 4096, FLAME_ERROR_INVALID_ARGUMENT, "n ", n, " is not in [1, 4096]");
    std::vector<Context*> cs;
    for (int32_t i = 0; i < n; ++i) {
      FLAME_CHECK(ctxs[i], FLAME_ERROR_INVALID_ARGUMENT, "ctxs[", i, "] is NULL");
      FLAME_CHECK(ctxs[i]->magic == kCtxMagic, FLAME_ERROR_INVALID_HANDLE, "ctxs[", i,
                  "] is not a live context (destroyed already?)");
      Context& c = *ctxs[i]->ctx;
      c.check_alive();
      FLAME_CHECK(std::find(cs.begin(), cs.end(), &c) == cs.end(), FLAME_ERROR_INVALID_ARGUMENT, "ctxs[", i,
                  "] is listed twice (one context per rank)");
      cs.push_back(&c);
    }
    flame_comm_options_t o = comm_options(opts);
    std::vector<std::shared_ptr<Comm>> made = Comm::create_group(cs, o.timeout_ms);
    std::vector<flame_comm_s*> handles;
    for (auto& m : made) handles.push_back(new flame_comm_s{kCommMagic, m});
    for (int32_t i = 0; i < n; ++i) comms[i] = handles[static_cast<size_t>(i)];
  });
}

FLAME_API void flame_comm_release(flame_comm_t comm) {
  if (!comm || comm->magic != kCommMagic || !comm->c) return;
  std::shared_ptr<Context> keep = comm->c->ctx().shared_from_this();
  std::lock_guard<std::recursive_mutex> lock(keep->mutex);
  keep->bind();
  comm->magic = kDeadMagic;
  comm->c.reset();  // the communicator goes here unless a data-parallel helper still holds it
  park(*keep, comm);
}

FLAME_API flame_status_t flame_comm_rank(flame_comm_t comm, int32_t* rank) {
  if (rank) *rank = 0;
  return api_call("flame_comm_rank", [&] {
    Comm& c = unwrap_comm(comm);
    LiveScope live(c.ctx());
    FLAME_CHECK(rank, FLAME_ERROR_INVALID_ARGUMENT, "rank is NULL");
    *rank = c.rank();
  });
}

FLAME_API flame_status_t flame_comm_size(flame_comm_t comm, int32_t* size) {
  if (size) *size = 0;
  return api_call("flame_comm_size", [&] {
    Comm& c = unwrap_comm(comm);
    LiveScope live(c.ctx());
    FLAME_CHECK(size, FLAME_ERROR_INVALID_ARGUMENT, "size is NULL");
    *size = c.world();
  });
}

FLAME_API flame_status_t flame_comm_synchronize(flame_comm_t comm) {
  return api_call("flame_comm_synchronize", [&] {
    Comm& c = unwrap_comm(comm);
    LiveScope live(c.ctx());
    c.synchronize();
  });
}

FLAME_API flame_status_t flame_comm_all_reduce(flame_comm_t comm, flame_tensor_t t, int32_t op) {
  return api_call("flame_comm_all_reduce", [&] {
    Comm& c = unwrap_comm(comm);
    LiveScope live(c.ctx());
    c.all_reduce(unwrap(t, "t"), op);
  });
}

FLAME_API flame_status_t flame_comm_broadcast(flame_comm_t comm, flame_tensor_t t, int32_t root) {
  return api_call("flame_comm_broadcast", [&] {
    Comm& c = unwrap_comm(comm);
    LiveScope live(c.ctx());
    c.broadcast(unwrap(t, "t"), root);
  });
}

FLAME_API flame_status_t flame_comm_all_gather(flame_comm_t comm, flame_tensor_t in, flame_tensor_t* out) {
  if (out) *out = nullptr;
  return api_call("flame_comm_all_gather", [&] {
    Comm& c = unwrap_comm(comm);
    LiveScope live(c.ctx());
    out_param(out, "out");
    *out = wrap(c.all_gather(unwrap(in, "in")));
  });
}

FLAME_API flame_status_t flame_comm_reduce_scatter(flame_comm_t comm, flame_tensor_t in, int32_t op, flame_tensor_t* out) {
  if (out) *out = nullptr;
  return api_call("flame_comm_reduce_scatter", [&] {
    Comm& c = unwrap_comm(comm);
    LiveScope live(c.ctx());
    out_param(out, "out");
    *out = wrap(c.reduce_scatter(unwrap(in, "in"), op));
  });
}

// ---------------- data parallelism ----------------

FLAME_API flame_status_t flame_dp_options_init(flame_dp_options_t* opts) {
  return api_call("flame_dp_options_init", [&] {
    FLAME_CHECK(opts, FLAME_ERROR_INVALID_ARGUMENT, "opts is NULL");
    *opts = flame_dp_options_t{};
    opts->struct_size = sizeof *opts;
    opts->bucket_bytes = uint64_t{64} << 20;
    opts->broadcast_parameters = 1;
  });
}

FLAME_API flame_status_t flame_dp_create(flame_comm_t comm, const flame_tensor_t* params, int64_t n, const flame_dp_options_t* opts,
                                         flame_dp_t* out) {
  if (out) *out = nullptr;
  return api_call("flame_dp_create", [&] {
    Comm& c = unwrap_comm(comm);
    out_param(out, "out");
    FLAME_CHECK(params || n == 0, FLAME_ERROR_INVALID_ARGUMENT, "params is NULL");
    FLAME_CHECK(n >= 0, FLAME_ERROR_INVALID_ARGUMENT, "n ", n, " is negative");
    std::vector<Tensor> ps = tensor_list(params, n, "params");
    flame_dp_options_t o;
    flame_dp_options_init(&o);
    if (opts) {
      FLAME_CHECK(opts->struct_size >= sizeof(size_t) && opts->struct_size <= 4096, FLAME_ERROR_INVALID_ARGUMENT,
                  "opts->struct_size is ", opts->struct_size, "; set it with flame_dp_options_init");
      std::memcpy(&o, opts, std::min(opts->struct_size, sizeof o));
      o.struct_size = sizeof o;
    }
    validate_dp_options(o);
    LiveScope scope(c.ctx());
    *out = new flame_dp_s{kDpMagic, std::make_shared<DataParallel>(comm->c, std::move(ps), o)};
  });
}

FLAME_API flame_status_t flame_dp_set_sync(flame_dp_t dp, int32_t sync) {
  return api_call("flame_dp_set_sync", [&] {
    DataParallel& d = unwrap_dp(dp);
    ContextScope scope(d.ctx());
    d.set_sync(sync != 0);
  });
}

FLAME_API flame_status_t flame_dp_wait(flame_dp_t dp) {
  return api_call("flame_dp_wait", [&] {
    DataParallel& d = unwrap_dp(dp);
    LiveScope scope(d.ctx());
    d.wait();
  });
}

FLAME_API void flame_dp_release(flame_dp_t dp) {
  if (!dp || dp->magic != kDpMagic || !dp->d) return;
  std::shared_ptr<Context> keep = dp->d->ctx().shared_from_this();
  std::lock_guard<std::recursive_mutex> lock(keep->mutex);
  keep->bind();
  dp->magic = kDeadMagic;
  dp->d.reset();
  park(*keep, dp);
}

// ---------------- sharded optimizer state and parameters (ZeRO-1, 2 and 3) ----------------

namespace {

// The bytes of a caller's flame_zero_options_t that hold its fields. A struct of the first version
// (through gather_slots) ends in 4 bytes of padding where reduce_dtype now lies: the communication
// dtypes are read only from a struct that holds both, else they keep their defaults.
size_t zero_options_bytes_to_read(size_t struct_size) {
  constexpr size_t kWithCommDtypes = offsetof(flame_zero_options_t, gather_dtype) + sizeof(int32_t);
  return struct_size >= kWithCommDtypes ? sizeof(flame_zero_options_t) : offsetof(flame_zero_options_t, reduce_dtype);
}

}  // namespace

FLAME_API flame_status_t flame_zero_options_init(flame_zero_options_t* opts) {
  return api_call("flame_zero_options_init", [&] {
    FLAME_CHECK(opts, FLAME_ERROR_INVALID_ARGUMENT, "opts is NULL");
    *opts = flame_zero_options_t{};
    opts->struct_size = sizeof *opts;
    opts->stage = 1;
    opts->broadcast_parameters = 1;
    opts->max_grad_norm = 0;
    opts->model = nullptr;
    opts->gather_slots = 2;
    opts->reduce_dtype = FLAME_ZERO_PARAM_DTYPE;
    opts->gather_dtype = FLAME_ZERO_PARAM_DTYPE;
  });
}

FLAME_API flame_status_t flame_zero_create(flame_comm_t comm, flame_optimizer_t opt, const flame_zero_options_t* opts,
                                           flame_zero_t* out) {
  if (out) *out = nullptr;
  return api_call("flame_zero_create", [&] {
    // The options first: bad values are refused before any handle is looked at.
    flame_zero_options_t zo;
    flame_zero_options_init(&zo);
    if (opts) {  // read only what the caller's (possibly older, smaller) struct holds
      FLAME_CHECK(opts->struct_size >= sizeof(size_t) && opts->struct_size <= 4096, FLAME_ERROR_INVALID_ARGUMENT,
                  "opts->struct_size is ", opts->struct_size, "; set it with flame_zero_options_init");
      std::memcpy(&zo, opts, std::min(opts->struct_size, zero_options_bytes_to_read(opts->struct_size)));
      zo.struct_size = sizeof zo;
    }
    validate_zero_options(zo);
    Comm& c = unwrap_comm(comm);
    out_param(out, "out");
    std::shared_ptr<Optimizer> o = optimizer_ref(opt);
    std::shared_ptr<models::ParamSharding> sharding;
    if (zo.stage == 3) sharding = std::make_shared<models::ParamSharding>(model_ref(zo.model, "opts->model"), comm->c, zo);
    LiveScope scope(c.ctx());
    auto z = std::make_shared<ZeroOptimizer>(comm->c, std::move(o), zo, sharding);
    *out = new flame_zero_s{kZeroMagic, std::move(z), std::move(sharding)};
  });
}

FLAME_API flame_status_t flame_zero_step(flame_zero_t zero, flame_tensor_t* total_norm) {
  if (total_norm) *total_norm = nullptr;
  return api_call("flame_zero_step", [&] {
    ZeroOptimizer& z = unwrap_zero(zero);
    LiveScope scope(z.ctx());
    Tensor norm = z.step(total_norm != nullptr);
    if (total_norm) *total_norm = wrap(norm);
  });
}

FLAME_API void flame_zero_release(flame_zero_t zero) {
  if (!zero || zero->magic != kZeroMagic || !zero->z) return;
  std::shared_ptr<Context> keep = zero->z->ctx().shared_from_this();
  std::lock_guard<std::recursive_mutex> lock(keep->mutex);
  keep->bind();
  zero->magic = kDeadMagic;
  zero->z.reset();
  zero->sharding.reset();
  park(*keep, zero);
}

FLAME_API flame_status_t flame_zero_gather_params(flame_zero_t zero, flame_params_t* params) {
  if (params) *params = nullptr;
  return api_call("flame_zero_gather_params", [&] {
    ZeroOptimizer& z = unwrap_zero(zero);
    flame_params_t* out = out_param(params, "params");
    FLAME_CHECK(zero->sharding, FLAME_ERROR_INVALID_ARGUMENT,
                "zero shards no model's parameters (stage 1 or 2): read the parameters themselves");
    LiveScope scope(z.ctx());
    *out = make_params_list(z.ctx(), zero->sharding->gather_params());
  });
}

FLAME_API flame_status_t flame_zero_save_full(flame_zero_t zero, const char* path) {
  return api_call("flame_zero_save_full", [&] {
    ZeroOptimizer& z = unwrap_zero(zero);
    FLAME_CHECK(path, FLAME_ERROR_INVALID_ARGUMENT, "path is NULL");
    LiveScope scope(z.ctx());
    save_zero_full(z, path);
  });
}

FLAME_API flame_status_t flame_zero_save_shards(flame_zero_t zero, const char* path_prefix) {
  return api_call("flame_zero_save_shards", [&] {
    ZeroOptimizer& z = unwrap_zero(zero);
    FLAME_CHECK(path_prefix, FLAME_ERROR_INVALID_ARGUMENT, "path_prefix is NULL");
    LiveScope scope(z.ctx());
    save_zero_shards(z, path_prefix);
  });
}

FLAME_API flame_status_t flame_zero_load(flame_zero_t zero, const char* path) {
  return api_call("flame_zero_load", [&] {
    ZeroOptimizer& z = unwrap_zero(zero);
    FLAME_CHECK(path, FLAME_ERROR_INVALID_ARGUMENT, "path is NULL");
    LiveScope scope(z.ctx());
    load_zero(z, path);
  });
}

}  // extern "C"
