// Fault injection for the watchdog tests, run under mpirun by expect_abort.sh:
//   comm_fault kill TIMEOUT     the last rank _exit()s before collective #6; the others must
//                               be aborted by their watchdogs naming it
//   comm_fault diverge TIMEOUT  rank 1 issues all_reduce where the others issue all_gather
// Exits 0 only if nothing went wrong, which the tests treat as a failure.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sharding/comm/group.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: comm_fault kill|diverge TIMEOUT_S\n");
    return 2;
  }
  const std::string mode = argv[1];
  sw::GroupPtr g = sw::world_group();
  g->set_timeout(std::atof(argv[2]));
  const int n = g->size(), r = g->rank();
  const int64_t count = 1000;
  std::vector<float> a(static_cast<size_t>(count * n), 1.f), b(static_cast<size_t>(count * n));
  for (int i = 1; i <= 10; i++) {
    if (mode == "kill" && i == 6 && r == n - 1) {
      std::fprintf(stderr, "comm_fault: rank %d exits before collective #%d\n", r, i);
      std::fflush(stderr);
      _exit(9);
    }
    if (mode == "diverge" && i == 4 && r == 1)
      g->all_reduce(a.data(), b.data(), count, sw::ReduceOp::Sum);
    else if (i % 2 == 0 || mode == "diverge")
      g->all_gather(a.data(), b.data(), count);
    else
      g->all_reduce(a.data(), b.data(), count, sw::ReduceOp::Sum);
  }
  std::fprintf(stderr, "comm_fault: rank %d completed every collective\n", r);
  return 0;
}
