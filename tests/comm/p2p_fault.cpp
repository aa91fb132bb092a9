// Fault injection for the point-to-point watchdog (sharding/comm/p2p.h), run under mpirun by
// expect_abort.sh with SHARDWISE_COMM_TIMEOUT_S set:
//   p2p_fault kill    after a good ring exchange, the last rank _exit()s; every other rank
//                     waits for a 4 MiB message (tag 77) from it and must be aborted by its
//                     watchdog, which names it ("rank N is not responding")
//   p2p_fault silent  the same, but the last rank stays alive, waiting for a message from
//                     rank 0 that never comes ("rank N has not posted the send (its oldest
//                     pending operation: recv from rank 0 ...)")
// Exits 0 only if nothing went wrong, which the tests treat as a failure.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "sharding/comm/group.h"
#include "sharding/comm/p2p.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: p2p_fault kill|silent\n");
    return 2;
  }
  const std::string mode = argv[1];
  sw::GroupPtr g = sw::world_group();
  sw::PeerCommPtr pc = sw::make_peer_comm(*g, "fault");
  const int n = pc->size(), r = pc->rank(), last = n - 1;
  std::vector<char> a(1000, 1), b(1000);
  sw::Work rw = pc->recv(b.data(), 1000, (r + n - 1) % n, 1);
  pc->send(a.data(), 1000, (r + 1) % n, 1).wait();
  rw.wait();
  g->barrier();
  std::vector<char> big(4 << 20);
  if (r == last) {
    if (mode == "kill") {
      std::fprintf(stderr, "p2p_fault: rank %d exits without sending\n", r);
      std::fflush(stderr);
      _exit(9);
    }
    std::fprintf(stderr, "p2p_fault: rank %d waits for rank 0 and never sends\n", r);
    std::fflush(stderr);
    pc->recv(b.data(), 8, 0, 5).wait();
  } else {
    pc->recv(big.data(), static_cast<int64_t>(big.size()), last, 77).wait();
  }
  std::fprintf(stderr, "p2p_fault: rank %d completed\n", r);
  return 0;
}
