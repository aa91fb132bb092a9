// Threads per rank for our kernels and BLAS: one OpenMP pool shared by both (the build links
// OpenBLAS's OpenMP variant, so its threads and ours never fight for the cores).
#pragma once

namespace sw {
// n <= 0: all cores divided by the ranks on this node; never above OMP_THREAD_LIMIT.
void set_num_threads(int n);
int num_threads();
// The count set_num_threads(n) sets where `local_ranks` ranks share this node (the planner's
// figure for a run it does not launch).
int threads_for(int n, int local_ranks);
}  // namespace sw
