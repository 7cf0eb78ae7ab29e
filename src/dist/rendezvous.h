// A TCP rendezvous that hands one 128-byte communicator identity from rank 0 to every other rank of
// a job whose ranks are separate processes (the torchrun convention: MASTER_ADDR:MASTER_PORT).
//
// Design: rank 0 binds and listens on master_addr:master_port itself (so master_addr must be an
// address of rank 0's host, or a name resolving to one; SO_REUSEADDR lets a job restart at once),
// accepts connections until world_size - 1 distinct ranks have said hello, then sends each an OK
// frame with the id. Every other rank connects (retrying every 50 ms while rank 0 is not up yet),
// sends a hello {magic "FLMRDZV1", version, rank, world_size} and waits for rank 0's answer. A client
// whose hello is foreign (wrong magic/version, or nothing within 2 s) is dropped and rank 0 goes on
// waiting for the real ranks; a real rank with a wrong world_size, a rank out of range or a rank
// already present gets a failure frame and rank 0 goes on too (the real one may still come). Past
// the deadline rank 0 sends a failure frame naming the ranks that did not arrive to those that did,
// and throws the same message. Single-threaded: poll() with one deadline; every socket is owned by
// an RAII wrapper (no fd leaks on any path); MSG_NOSIGNAL on every send (no SIGPIPE).
// Every failure (network, timeout, refused hello) is FLAME_ERROR_IO; bad arguments are
// FLAME_ERROR_INVALID_ARGUMENT. No process-wide state.
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace flame {

constexpr size_t kRendezvousIdBytes = 128;
using RendezvousId = std::array<uint8_t, kRendezvousIdBytes>;

struct RendezvousPeer {
  std::string master_addr;  // a host name or an IPv4/IPv6 address
  int32_t master_port = 0;  // in [1, 65535]
  int32_t rank = 0;
  int32_t world_size = 1;
  double timeout_seconds = 30;  // (0, 86400]
};

// Rank 0: sends id to every other rank and returns it. Other ranks: returns the id rank 0 sent.
// world_size 1: returns id at once without touching the network. Throws flame::Error.
RendezvousId rendezvous_exchange(const RendezvousPeer& peer, const RendezvousId& id);

}  // namespace flame
