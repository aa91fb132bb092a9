// The device side of the tests' StreamGate (cuda_test_util.h): one thread that spins until a
// flag in mapped pinned host memory is set. A kernel, not a host function: a host function
// that blocks occupies the driver's callback thread, which other libraries' host functions
// (NCCL's among them) need, and the first GPU run of test_nccl hung with one.
#include <cuda_runtime.h>

namespace {
__global__ void gate_spin(const volatile int* flag) {
  while (*flag == 0) __nanosleep(2000);
}
}  // namespace

namespace sw::test {
cudaError_t launch_stream_gate(cudaStream_t s, const int* device_flag) {
  gate_spin<<<1, 1, 0, s>>>(device_flag);
  return cudaGetLastError();
}
}  // namespace sw::test
