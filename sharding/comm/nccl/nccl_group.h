// Collectives on CUDA device memory through NCCL (docs/ARCHITECTURE.md, "Collectives on
// devices"). Built when the CUDA backend and NCCL are found; registered as the CUDA device
// group factory (sharding/comm/group.h register_device_group_factory), so the engine reaches
// it through device_group(host, Device::cuda(i)). Run at one rank on an H100; two ranks on two
// GPUs have never run.
//
// NcclGroup (nccl_group.cpp), a Group whose buffers are on this process's CUDA device:
//   * Made collectively over a host group: every rank all-gathers its GpuIdentity; when any
//     rank has no GPU (or was asked for a device other than its own) or two ranks share a GPU,
//     every rank returns nullptr (the same decision everywhere, from the same gathered data).
//     Otherwise rank 0's ncclGetUniqueId is broadcast over the host group and every rank calls
//     ncclCommInitRankConfig. The group keeps its own copy of the host group
//     (host.split(0, rank)) for split().
//   * issue(c): on the group's non-blocking, high-priority comm stream, after the compute
//     stream's work so far (an event recorded there, waited for on the comm stream):
//     ncclAllGather / ncclReduceScatter / ncclAllReduce / ncclBroadcast; a barrier is a
//     one-float all-reduce on a scratch buffer of the group. A CUDA event is recorded after it
//     and becomes the Work's native event (done stays false: Work::wait synchronises on it,
//     a device stream waits on it without blocking the host). send and recv are
//     cuda_record_stream'ed on the comm stream, so the caching allocator reuses their blocks
//     only after the collective. Algorithms (CommAlgo) are NCCL's own: the field is ignored.
//   * No hangs: a Work's synchronize polls cudaEventQuery with short sleeps, checks
//     ncclCommGetAsyncError, and after CommOptions::timeout_s calls ncclCommAbort and throws
//     sw::Error("comm: nccl <collective> #seq timed out after Ns on rank R of N ..."). The
//     communicator is non-blocking (ncclConfig_t::blocking = 0) so that creation and the
//     enqueue of a collective, which may wait for peers, are polled under the same limit;
//     SHARDWISE_NCCL_BLOCKING=1 makes it blocking (those two calls may then wait forever).
//     After an abort every later collective of the group throws.
//   * Stats: ops and bytes counted when issued; comm_s stays 0 (no timing events);
//     exposed_s is the time callers spent in Work::wait. CommOptions::debug and delay_us
//     are ignored.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sharding/comm/group.h"

namespace sw {

// What a rank tells the others before a NCCL communicator is made. All-gathered as raw bytes
// (12 f32 words), so its size is a multiple of 4 and it has no padding.
struct GpuIdentity {
  uint64_t host_hash = 0;   // FNV-1a of gethostname()
  uint8_t uuid[16] = {};    // cudaDeviceProp::uuid
  char bus_id[20] = {};     // cudaDeviceGetPCIBusId, e.g. "0000:3b:00.0"
  int32_t status = 0;       // 1: a GPU; 0: no GPU; -1: asked for a device not this process's
};
static_assert(sizeof(GpuIdentity) == 48, "GpuIdentity travels as 12 f32 words");

// Why NCCL cannot serve these ranks (index = rank), "" when it can: a rank without its GPU,
// or two ranks on one GPU (equal uuids, or equal host and bus id). Pure, so every rank that
// holds the same gathered identities decides the same.
std::string nccl_refusal(const std::vector<GpuIdentity>& ranks);

// The device group factory (collective over `host`; nullptr on every rank when refused).
GroupPtr make_nccl_group(Group& host, Device dev);

}  // namespace sw
