// The simulated accelerator (DeviceKind::Sim, core/device.h) for tests: device memory is host
// memory in one reserved arena that is mapped PROT_NONE except while one of the device's own
// ops or copies runs, so host code that reads or writes device memory directly (instead of
// through Ops or copy_bytes) faults at once. The handler names the address and prints a
// backtrace; and an op given host memory for any pointer argument exits with 87, naming the op
// and the argument (a GPU kernel cannot read pageable host memory). The ops are the CPU's (bitwise the CPU results) wrapped in that opening and
// closing; the stream is the host stream. Registered at program start by linking the
// sw_sim_device library whole; serves Device::sim(0) with fp32, bf16 and fp16 compute.
//
// Opening is counted, so concurrent ops and copies (a staged group's thread) nest; while any
// is open every thread may touch the arena: the check catches stray accesses made while the
// device is idle, which is where a host-side access in the engine happens.
//
// SHARDWISE_SIM_GUARD=0 (benchmarks) leaves the arena readable and writable: no mprotect per
// op, and no fault either.
//
// Asynchronous copies (copy_bytes_async) are lazy: a copy runs only when its event (or a later
// one of the same direction) is waited for or queried. Host pinning is registered (spans
// recorded, nothing locked), and a copy whose host side is pageable runs at once and counts as
// a host synchronisation, as cudaMemcpyAsync with pageable memory is one. Code that uses a copy's destination
// before waiting, or touches its source or destination meanwhile, sees other bytes than the
// CPU run, so the bit-for-bit comparisons catch a missing wait.
#pragma once
#include <cstddef>
#include <cstdint>

namespace swtest {
// Bytes of the arena in use (allocated blocks) and the number of times it was opened.
size_t sim_device_bytes_in_use();
uint64_t sim_device_opens();
// True while the arena is open (an op or copy is running).
bool sim_device_open();
// Whether p lies in the arena.
bool sim_device_owns(const void* p);
// Asynchronous copies issued so far and those that have run (all directions).
uint64_t sim_copies_issued();
uint64_t sim_copies_done();
// Host synchronisations with the device the calling thread has made: synchronous copies, ops
// whose result the host reads (the loss, sums of squares), and host waits for an asynchronous
// copy or for the compute stream (a wait the compute stream makes for an event, or a query of
// an event, is not one).
uint64_t sim_host_syncs();
// Asynchronous copies the calling thread issued with a pageable host side (not in a span the
// sim's host pinning recorded): on CUDA they wait for the stream, so each is one of the
// synchronisations above, and it runs at once.
uint64_t sim_unpinned_copies();
}  // namespace swtest
