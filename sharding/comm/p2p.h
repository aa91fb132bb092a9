// Point-to-point messages between the ranks of a group, for pipeline parallelism: stages send
// activations forward and their gradients back, posted in orders that differ from rank to rank,
// which collectives (one sequence on every rank) cannot express.
//
// A PeerComm is made collectively over a Group and then used by each rank on its own: a send
// matches the receive of the same (source, tag) on its peer, whatever else is in flight;
// several messages with the same (peer, tag) match in posting order. Both calls only enqueue and
// return a Work (sharding/comm/group.h), waited on like a collective's.
//
// Backends:
//   * MPI (an MpiGroup): a communicator split from the group's on its communication thread, so
//     these messages never meet the group's collectives; one progress thread posts the
//     MPI_Isend/MPI_Irecv in enqueue order and completes them with MPI_Testsome (busy-polls
//     for the group's spin_us after each progress, then naps: at most 20 us for the first
//     millisecond, 200 us after; it sleeps while nothing is pending); a watchdog thread: an
//     operation pending longer than the group's timeout_s (read at creation: set the group's
//     options first) asks the peer's watchdog about it, prints ONE line and aborts the job:
//       p2p[<name>]: rank 3: recv from rank 1 (tag 77, 4194304 bytes) not complete after 300 s: rank 1 is not responding
//     (or "rank 1 has not posted the send ...", naming what it is waiting for itself).
//   * local (a one-rank group): sends to itself are matched in memory; a send whose receive is
//     not posted yet is copied aside and completes at once.
// Ranks in messages are MPI_COMM_WORLD ranks, as in MpiGroup's (the peer arguments are group
// ranks).
//
// Wire format (MPI): a send is a 16-byte header {bytes, chunk} on MPI tag 2*tag, then
// ceil(bytes/chunk) data messages of `chunk` bytes (the last shorter) on tag 2*tag+1, so
// messages of 2^31 bytes and more travel with int counts. The receiver posts the header at
// once and the data once the header says its size (in the sender's chunks): a size mismatch
// fails the receive's Work with one line naming peer, tag and both sizes, and the sender's
// data is received into a scratch chunk and dropped, so later messages on that tag still match.
//
// Buffers must stay valid, unread (recv) and unwritten (send), until the Work completes.
// send/recv may be called from any thread while the progress thread runs. Destruction: pending
// receives not yet matched are cancelled (their Work fails), sends and matched receives get
// min(timeout_s, 5 s) to complete, then are abandoned (their Work fails; a peer that still
// receives one may read the buffer later, so destroy PeerComms only when the traffic is done).
// The MPI backend's PeerComms are shut down at exit before MPI_Finalize.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "sharding/comm/group.h"

namespace sw {

class PeerComm {
 public:
  virtual ~PeerComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Enqueue: send `bytes` bytes of buf to rank `peer` of the group with `tag` (0 <= tag < 2^20).
  // Completes when buf may be reused. Never blocks the caller.
  virtual Work send(const void* buf, int64_t bytes, int peer, int tag) = 0;
  // Enqueue: receive exactly `bytes` bytes from `peer` with `tag` into buf (a size mismatch
  // fails the Work with one line naming peer, tag and both sizes).
  virtual Work recv(void* buf, int64_t bytes, int peer, int tag) = 0;
  // ops: sends and receives completed; bytes: sent + received; comm_s: the sum of each
  // operation's time from posting to completion (overlapping operations add up);
  // exposed_s: time callers spent blocked in Work::wait.
  virtual CommStats stats() const = 0;
  virtual void reset_stats() = 0;
};
using PeerCommPtr = std::shared_ptr<PeerComm>;

constexpr int kP2PMaxTag = 1 << 20;                     // tags are 0 .. kP2PMaxTag-1
constexpr int64_t kP2PChunkBytes = int64_t(256) << 20;  // data message size on MPI

// Collective over `group` (an MPI group or a one-rank group; otherwise sw::Error). `name`
// appears in its messages. chunk_bytes (1 .. 2^30): this rank's data message size; ranks may
// differ (the header carries it).
PeerCommPtr make_peer_comm(Group& group, const std::string& name,
                           int64_t chunk_bytes = kP2PChunkBytes);

namespace detail {
// The data messages of a `bytes`-byte send in chunks of `chunk`: their count (0 for 0 bytes)
// and message i's length (all `chunk` but the last).
int64_t p2p_chunk_count(int64_t bytes, int64_t chunk);
int64_t p2p_chunk_len(int64_t bytes, int64_t chunk, int64_t i);
}  // namespace detail

}  // namespace sw
