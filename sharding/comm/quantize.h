// Compressed collectives (ZeRO++'s qwZ and qgZ): block-wise int8 / int4 quantisation with one
// fp32 scale per block, and the collectives that move quantised data.
//
// Quantisation of n fp32 values in blocks of `block` values (the last one shorter):
//   scale_b = absmax_b / qmax (qmax 127 for int8, 7 for int4; 0 for an all-zero block)
//   code_i  = round-half-even(x_i / scale_b), in [-qmax, qmax]
//   x_i ~= code_i * scale_b, so |x_i - x~_i| <= absmax_b / qmax / 2.
// A block holding a NaN or an infinity gets a NaN scale, so the overflow check downstream sees
// it. Deterministic: a pure function of the input values.
// Packed form (quant_packed_bytes): the ceil(n/block) fp32 scales, then the codes (int8: one
// byte each; int4: two per byte, even index in the low nibble, two's complement), then the
// values of the blocks sent exact (QuantSpec::raw) as fp32, padded to a multiple of 4 bytes, so
// a packed buffer travels as f32 elements of a raw all-gather.
//
// Error feedback (quantize_ef): the error of what a rank sent is kept and added to what it
// sends next time: x' = x + e; send Q(x'); e := x' - DQ(Q(x')). Over K sends the sum of what
// was sent is the sum of the inputs minus the last residual, which stays bounded (per value by
// absmax/qmax/2 of its block), so nothing is lost, only delayed.
//
// The collectives (CPU buffers; blocking, on the calling thread, except the all-gather's issue):
//   * quantized all-gather: every rank quantises its shard into its slot of a packed buffer
//     (issue_quantized_all_gather), a raw all-gather of the packed bytes runs on the group's
//     thread, and finish_quantized_all_gather dequantises every slot, the own one included, so
//     every rank holds the same values.
//   * quantized_reduce_scatter: all-to-all based (ZeRO++'s qgZ): each rank quantises block j of
//     its input (with error feedback) and sends it to rank j over a PeerComm; each rank
//     dequantises the size() blocks it received and adds them in rank order in fp32. One
//     quantisation per value; what a rank sends is (size-1)/size of its packed input.
//   * quantized_all_reduce: quantized_reduce_scatter of size() chunks, then the reduced chunk
//     requantised (with error feedback of its own, kept by its owner) and sent to every rank;
//     every rank dequantises the same bytes, so results are identical on every rank.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/alloc.h"
#include "sharding/comm/group.h"
#include "sharding/comm/p2p.h"

namespace sw {

struct QuantSpec {
  int bits = 8;         // 8 or 4
  int64_t block = 256;  // values per scale (>= 1)
  // Where set: the blocks' first indices instead (ascending, the first 0), so that a block
  // never straddles two tensors of a flat buffer (a bias then has a scale of its own instead
  // of sharing a weight's). Must outlive every call given the spec.
  const std::vector<int64_t>* starts = nullptr;
  // With starts: per block, 1 = sent exact (fp32, after the codes; its scale 0, codes 0): the
  // blocks of 1-D tensors (biases, norm gains), which DeepSpeed keeps unpartitioned and so never
  // quantises, and whose learned deviations from 1 or 0 are about one int8 step.
  const std::vector<uint8_t>* raw = nullptr;
  int qmax() const { return bits == 4 ? 7 : 127; }
};
// The block starts of [lo, hi) of a flat buffer whose tensors start at `tensor_starts`
// (ascending): a block at lo, at each tensor's start inside, and every `block` values after
// each of them. Relative to lo. With tensor_raw (per tensor) and raw_out: each block's flag,
// its tensor's (the one starting at or before the block; a block before every tensor: 0).
std::vector<int64_t> quant_block_starts(int64_t lo, int64_t hi,
                                        const std::vector<int64_t>& tensor_starts, int64_t block,
                                        const std::vector<uint8_t>* tensor_raw = nullptr,
                                        std::vector<uint8_t>* raw_out = nullptr);

// Bytes of the packed form of n values (scales + codes, padded to 4 bytes).
int64_t quant_packed_bytes(int64_t n, const QuantSpec& q);
// out (quant_packed_bytes(n)) := the packed quantisation of x (n).
void quantize(const float* x, int64_t n, const QuantSpec& q, void* out);
// y (n) := the dequantised values of `in`; dequantize_add: y += them.
void dequantize(const void* in, int64_t n, const QuantSpec& q, float* y);
void dequantize_add(const void* in, int64_t n, const QuantSpec& q, float* y);
// With error feedback: x' = x + err; out := Q(x'); err := x' - DQ(out). x == err: err already
// holds x'.
void quantize_ef(const float* x, float* err, int64_t n, const QuantSpec& q, void* out);

// Quantised all-gather of `n` values per rank (n is the same on every rank). `wire` is resized
// (Mem::Communication) to size() packed slots; it must live, untouched, until finish.
// per_rank (optional, size() specs): rank r's shard is quantised with per_rank[r] (its block
// table); every slot is then as large as the largest rank's packed shard.
Work issue_quantized_all_gather(Group& g, const float* shard, int64_t n, const QuantSpec& q,
                                Buffer& wire, const QuantSpec* per_rank = nullptr);
// After the Work completed: out (size() * n) := every rank's dequantised shard, in rank order.
void finish_quantized_all_gather(const Group& g, const Buffer& wire, int64_t n,
                                 const QuantSpec& q, float* out,
                                 const QuantSpec* per_rank = nullptr);

// Quantised reduce-scatter over the ranks of `pc`: out (n) := scale * sum over ranks r (in rank
// order) of DQ(Q(in_r[rank*n .. (rank+1)*n) + err_r[...])). in (size*n) is read; err (size*n)
// is this rank's residual, updated (null: no error feedback). out may be in's own block.
// Collective over pc's ranks; `tag` must not be used by other traffic on pc at the same time.
// per_block (optional, size() specs): block j is quantised with per_block[j].
void quantized_reduce_scatter(PeerComm& pc, const float* in, float* err, float* out, int64_t n,
                              const QuantSpec& q, float scale, int tag = 11,
                              const QuantSpec* per_block = nullptr);
// Quantised all-reduce, in place: buf (n) := scale * sum over ranks of buf. err1 (n): the
// residual of the reduce-scatter stage, err2 (quant_ar_chunk(n, size)): the residual of this
// rank's reduced chunk as sent in the gather stage (either null: none). Identical on every rank.
void quantized_all_reduce(PeerComm& pc, float* buf, int64_t n, float* err1, float* err2,
                          const QuantSpec& q, float scale, int tag = 13);
// The chunk each rank reduces in quantized_all_reduce: ceil(n / size).
int64_t quant_ar_chunk(int64_t n, int size);

namespace detail {
struct WorkState;
}

// Runs the blocking quantised collectives above off the calling thread, one at a time in the
// order issued (a PeerComm's tags are reused by every call, so calls on it must not interleave;
// one worker per model serves its shard and replica transports), so that they overlap the
// caller's compute. Each issue returns a Work completed when its function returned (failed with
// its exception's text). The destructor finishes what was issued. `on_start` runs first on the
// new thread: the kernels' thread count, which a new thread does not inherit (OpenMP's team size
// is per thread; unset, the quantisers' parallel loops would open one thread per core).
class QuantWorker {
 public:
  explicit QuantWorker(std::function<void()> on_start = {});
  ~QuantWorker();
  QuantWorker(const QuantWorker&) = delete;
  QuantWorker& operator=(const QuantWorker&) = delete;
  Work issue(std::function<void()> fn);

 private:
  void loop(const std::function<void()>& on_start);
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<detail::WorkState>>> q_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace sw
