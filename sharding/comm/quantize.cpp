#include "sharding/comm/quantize.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "sharding/comm/work.h"

namespace sw {

namespace {

int64_t nblocks(int64_t n, const QuantSpec& q) {
  return q.starts ? static_cast<int64_t>(q.starts->size()) : (n + q.block - 1) / q.block;
}
// Block b's range [lo, hi) of n values.
inline int64_t block_lo(int64_t b, const QuantSpec& q) {
  return q.starts ? (*q.starts)[static_cast<size_t>(b)] : b * q.block;
}
inline int64_t block_hi(int64_t b, int64_t n, const QuantSpec& q) {
  if (!q.starts) return std::min(n, (b + 1) * q.block);
  const size_t k = static_cast<size_t>(b + 1);
  return k < q.starts->size() ? (*q.starts)[k] : n;
}
inline bool is_raw(int64_t b, const QuantSpec& q) {
  return q.raw && q.starts && (*q.raw)[static_cast<size_t>(b)];
}
// Values sent exact, and each block's offset among them (-1: quantised).
int64_t raw_values(int64_t n, const QuantSpec& q, std::vector<int64_t>* at = nullptr) {
  if (!q.raw || !q.starts) return 0;
  const int64_t B = nblocks(n, q);
  if (at) at->assign(static_cast<size_t>(B), -1);
  int64_t k = 0;
  for (int64_t b = 0; b < B; ++b)
    if (is_raw(b, q)) {
      if (at) (*at)[static_cast<size_t>(b)] = k;
      k += block_hi(b, n, q) - block_lo(b, q);
    }
  return k;
}
int64_t code_bytes(int64_t n, const QuantSpec& q) { return q.bits == 4 ? (n + 1) / 2 : n; }

void check_spec(const QuantSpec& q) {
  SW_CHECK((q.bits == 8 || q.bits == 4) && q.block >= 1,
           "quantize: bits must be 8 or 4, block >= 1");
}

// A block's scale: absmax / qmax, 0 for an all-zero block, NaN where it holds a NaN or an
// infinity.
float block_scale(const float* x, int64_t m, int qmax) {
  float amax = 0.f;
  int bad = 0;
#pragma omp simd reduction(max : amax) reduction(| : bad)
  for (int64_t i = 0; i < m; ++i) {
    const float a = std::fabs(x[i]);
    bad |= !(a <= 3.4028235e38f);
    amax = a > amax ? a : amax;
  }
  if (bad) return std::nanf("");
  return amax / static_cast<float>(qmax);
}

// codes[0, m) of x in a block of scale s: round half to even (nearbyint in the default
// rounding mode) of x / s, clamped to [-qmax, qmax]; 0 where s is 0 or NaN.
void block_codes(const float* x, int64_t m, float s, int qmax, int8_t* codes) {
  if (!(s > 0.f)) {
    std::memset(codes, 0, static_cast<size_t>(m));
    return;
  }
  const float inv = 1.f / s, hi = static_cast<float>(qmax);
#pragma omp simd
  for (int64_t i = 0; i < m; ++i) {
    float c = std::nearbyint(x[i] * inv);
    c = c > hi ? hi : (c < -hi ? -hi : c);
    codes[i] = static_cast<int8_t>(c);
  }
}

// Quantises x[lo, lo + m) (one block) into the packed codes; with `err` (x' = err + x already
// stored in err when x == err) updates err to x' - DQ. Returns the block's scale.
float quantize_one(const float* x, float* err, int64_t lo, int64_t m, const QuantSpec& q,
                   uint8_t* codes) {
  const float* src = x + lo;
  if (err) {
    float* e = err + lo;
    if (x != err) {
#pragma omp simd
      for (int64_t i = 0; i < m; ++i) e[i] += src[i];
    }
    src = e;
  }
  const int qmax = q.qmax();
  const float s = block_scale(src, m, qmax);
  constexpr int64_t kPiece = 512;
  int8_t c[kPiece];
  for (int64_t p = 0; p < m; p += kPiece) {
    const int64_t k = std::min(kPiece, m - p);
    block_codes(src + p, k, s, qmax, c);
    const int64_t at = lo + p;
    if (q.bits == 8) {
      std::memcpy(codes + at, c, static_cast<size_t>(k));
    } else if (!(at & 1) && !(k & 1)) {  // whole bytes
      uint8_t* o = codes + (at >> 1);
#pragma omp simd
      for (int64_t j = 0; j < k / 2; ++j)
        o[j] = static_cast<uint8_t>((c[2 * j] & 0xF) | (static_cast<uint8_t>(c[2 * j + 1]) << 4));
    } else {
      for (int64_t i = 0; i < k; ++i) {
        uint8_t& byte = codes[(at + i) >> 1];
        const uint8_t nib = static_cast<uint8_t>(c[i] & 0xF);
        byte = ((at + i) & 1) ? static_cast<uint8_t>((byte & 0x0F) | (nib << 4))
                              : static_cast<uint8_t>((byte & 0xF0) | nib);
      }
    }
    if (err) {
      float* e = err + lo + p;
#pragma omp simd
      for (int64_t i = 0; i < k; ++i) e[i] -= static_cast<float>(c[i]) * s;
    }
  }
  return s;
}

inline int code_at(const uint8_t* codes, int64_t i, int bits) {
  if (bits == 8) return static_cast<int8_t>(codes[i]);
  const int nib = (codes[i >> 1] >> ((i & 1) * 4)) & 0xF;
  return nib >= 8 ? nib - 16 : nib;
}

template <bool Add>
void dequant(const void* in, int64_t n, const QuantSpec& q, float* y) {
  check_spec(q);
  const float* scales = static_cast<const float*>(in);
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(scales + nblocks(n, q));
  const int64_t B = nblocks(n, q);
  std::vector<int64_t> rat;
  raw_values(n, q, &rat);
  const uint8_t* rawb = codes + code_bytes(n, q);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t b = 0; b < B; ++b) {
    const float s = scales[b];
    const int64_t lo = block_lo(b, q), hi = block_hi(b, n, q);
    if (is_raw(b, q)) {
      const uint8_t* src = rawb + 4 * rat[static_cast<size_t>(b)];
      for (int64_t i = lo; i < hi; ++i) {
        float v;
        std::memcpy(&v, src + 4 * (i - lo), 4);
        if constexpr (Add)
          y[i] += v;
        else
          y[i] = v;
      }
      continue;
    }
    if (q.bits == 4 && !(lo & 1)) {  // whole bytes: two values each
      const int64_t pairs = (hi - lo) / 2;
      const uint8_t* cb = codes + lo / 2;
      float* yo = y + lo;
#pragma omp simd
      for (int64_t j = 0; j < pairs; ++j) {
        const int8_t lo4 = static_cast<int8_t>(static_cast<uint8_t>(cb[j] << 4)) >> 4;
        const int8_t hi4 = static_cast<int8_t>(cb[j]) >> 4;
        const float v0 = static_cast<float>(lo4) * s, v1 = static_cast<float>(hi4) * s;
        if constexpr (Add) {
          yo[2 * j] += v0;
          yo[2 * j + 1] += v1;
        } else {
          yo[2 * j] = v0;
          yo[2 * j + 1] = v1;
        }
      }
      if ((hi - lo) & 1) {
        const float v = static_cast<float>(code_at(codes, hi - 1, 4)) * s;
        if constexpr (Add)
          y[hi - 1] += v;
        else
          y[hi - 1] = v;
      }
      continue;
    }
    for (int64_t i = lo; i < hi; ++i) {
      const float v = static_cast<float>(code_at(codes, i, q.bits)) * s;
      if constexpr (Add)
        y[i] += v;
      else
        y[i] = v;
    }
  }
}

void wait_all(std::vector<Work>& w) {
  for (Work& x : w) x.wait();
  w.clear();
}

}  // namespace

int64_t quant_packed_bytes(int64_t n, const QuantSpec& q) {
  check_spec(q);
  const int64_t b = nblocks(n, q) * 4 + code_bytes(n, q) + 4 * raw_values(n, q);
  return (b + 3) / 4 * 4;
}

namespace {
void quantize_impl(const float* x, float* err, int64_t n, const QuantSpec& q, void* out) {
  check_spec(q);
  const int64_t B = nblocks(n, q);
  float* scales = static_cast<float*>(out);
  uint8_t* codes = reinterpret_cast<uint8_t*>(scales + B);
  const int64_t cb = code_bytes(n, q);
  std::vector<int64_t> rat;
  const int64_t rv = raw_values(n, q, &rat);
  uint8_t* rawb = codes + cb;  // the exact values (unaligned: memcpy)
  const int64_t pad = quant_packed_bytes(n, q) - B * 4 - cb - 4 * rv;
  std::memset(rawb + 4 * rv, 0, static_cast<size_t>(pad));
  if (q.bits == 4 && (n & 1)) codes[n >> 1] = 0;  // the unused high nibble
  // int4 blocks of odd length share bytes with their neighbours: one thread then.
  bool serial = q.bits == 4 && (q.block & 1);
  if (q.bits == 4 && q.starts)
    for (int64_t s : *q.starts) serial = serial || (s & 1);
  SW_CHECK(!q.starts || (!q.starts->empty() && q.starts->front() == 0 &&
                         q.starts->back() < std::max<int64_t>(n, 1)),
           "quantize: block starts must begin at 0 and lie inside the buffer");
#pragma omp parallel for schedule(static) if (n > (1 << 16) && !serial)
  for (int64_t b = 0; b < B; ++b) {
    const int64_t lo = block_lo(b, q), m = block_hi(b, n, q) - lo;
    if (is_raw(b, q)) {  // exact: codes 0, the values after the codes, no residual left
      scales[b] = 0.f;
      const float* src = x + lo;
      if (err) {
        if (x != err)
          for (int64_t i = 0; i < m; ++i) err[lo + i] += x[lo + i];
        src = err + lo;
      }
      std::memcpy(rawb + 4 * rat[static_cast<size_t>(b)], src, static_cast<size_t>(m) * 4);
      if (err) std::memset(err + lo, 0, static_cast<size_t>(m) * 4);
      if (q.bits == 8) {
        std::memset(codes + lo, 0, static_cast<size_t>(m));
      } else {
        for (int64_t i = lo; i < lo + m; ++i)
          codes[i >> 1] = static_cast<uint8_t>(codes[i >> 1] & ((i & 1) ? 0x0F : 0xF0));
      }
      continue;
    }
    scales[b] = quantize_one(x, err, lo, m, q, codes);
  }
}
}  // namespace

void quantize(const float* x, int64_t n, const QuantSpec& q, void* out) {
  quantize_impl(x, nullptr, n, q, out);
}

void dequantize(const void* in, int64_t n, const QuantSpec& q, float* y) {
  dequant<false>(in, n, q, y);
}

void dequantize_add(const void* in, int64_t n, const QuantSpec& q, float* y) {
  dequant<true>(in, n, q, y);
}

void quantize_ef(const float* x, float* err, int64_t n, const QuantSpec& q, void* out) {
  quantize_impl(x, err, n, q, out);
}

namespace {
// The slot of a quantised all-gather: the largest rank's packed shard.
int64_t slot_bytes(const Group& g, int64_t n, const QuantSpec& q, const QuantSpec* per_rank) {
  if (!per_rank) return quant_packed_bytes(n, q);
  int64_t m = 0;
  for (int r = 0; r < g.size(); ++r) m = std::max(m, quant_packed_bytes(n, per_rank[r]));
  return m;
}
}  // namespace

Work issue_quantized_all_gather(Group& g, const float* shard, int64_t n, const QuantSpec& q,
                                Buffer& wire, const QuantSpec* per_rank) {
  const int64_t pb = slot_bytes(g, n, q, per_rank);
  const size_t need = static_cast<size_t>(pb) * static_cast<size_t>(g.size());
  if (wire.bytes() < need) wire = Buffer(need, Mem::Communication);
  uint8_t* w = wire.as<uint8_t>();
  quantize(shard, n, per_rank ? per_rank[g.rank()] : q, w + g.rank() * pb);
  // raw bytes as f32 elements, in place
  return g.issue_all_gather(w + g.rank() * pb, w, pb / 4, DType::F32);
}

void finish_quantized_all_gather(const Group& g, const Buffer& wire, int64_t n,
                                 const QuantSpec& q, float* out, const QuantSpec* per_rank) {
  const int64_t pb = slot_bytes(g, n, q, per_rank);
  const uint8_t* w = wire.as<uint8_t>();
  for (int r = 0; r < g.size(); ++r)
    dequantize(w + r * pb, n, per_rank ? per_rank[r] : q, out + r * n);
}

void quantized_reduce_scatter(PeerComm& pc, const float* in, float* err, float* out, int64_t n,
                              const QuantSpec& q, float scale, int tag,
                              const QuantSpec* per_block) {
  const int P = pc.size(), me = pc.rank();
  // block j travels in block j's format (its spec's block table) in a slot of the largest's
  auto spec = [&](int j) -> const QuantSpec& { return per_block ? per_block[j] : q; };
  int64_t pb = 0;
  for (int j = 0; j < P; ++j) pb = std::max(pb, quant_packed_bytes(n, spec(j)));
  const int64_t mine = quant_packed_bytes(n, spec(me));
  Buffer send(static_cast<size_t>(pb * P), Mem::Communication);
  Buffer recv(static_cast<size_t>(pb * P), Mem::Communication);
  uint8_t* s = send.as<uint8_t>();
  uint8_t* r = recv.as<uint8_t>();
  std::vector<Work> w;
  // Receives first, then each block quantised and sent as soon as it is ready.
  for (int j = 0; j < P; ++j)
    if (j != me) w.push_back(pc.recv(r + j * pb, mine, j, tag));  // (in my block's format)
  for (int k = 1; k <= P; ++k) {
    const int j = (me + k) % P;  // the own block last: it lands directly in its slot
    uint8_t* dst = j == me ? r + j * pb : s + j * pb;
    quantize_ef(in + j * n, err ? err + j * n : nullptr, n, spec(j), dst);
    if (j != me) w.push_back(pc.send(dst, quant_packed_bytes(n, spec(j)), j, tag));
  }
  wait_all(w);
  // out := scale * sum in rank order (out may be in's own block, already quantised)
  dequantize(r, n, spec(me), out);
  for (int j = 1; j < P; ++j) dequantize_add(r + j * pb, n, spec(me), out);
  if (scale != 1.f)
    for (int64_t i = 0; i < n; ++i) out[i] *= scale;
}

std::vector<int64_t> quant_block_starts(int64_t lo, int64_t hi,
                                        const std::vector<int64_t>& tensor_starts, int64_t block,
                                        const std::vector<uint8_t>* tensor_raw,
                                        std::vector<uint8_t>* raw_out) {
  std::vector<int64_t> out{0};
  std::vector<uint8_t> raw;
  // the cuts: each tensor start inside (lo, hi), and every `block` values after lo and after
  // each of them
  size_t t = 0;
  while (t < tensor_starts.size() && tensor_starts[t] <= lo) ++t;
  auto flag = [&](size_t tensor_after) -> uint8_t {  // the tensor before index tensor_after
    return tensor_raw && tensor_after > 0 ? (*tensor_raw)[tensor_after - 1] : 0;
  };
  raw.push_back(flag(t));
  int64_t seg = lo;  // the current segment's first index
  for (;;) {
    const int64_t next = t < tensor_starts.size() ? std::min(tensor_starts[t], hi) : hi;
    for (int64_t b = seg + block; b < next; b += block)
      out.push_back(b - lo), raw.push_back(raw.back());
    if (next >= hi) break;
    if (next - lo > out.back())
      out.push_back(next - lo), raw.push_back(flag(t + 1));
    else
      raw.back() = flag(t + 1);
    seg = next;
    ++t;
  }
  if (raw_out) *raw_out = std::move(raw);
  return out;
}

int64_t quant_ar_chunk(int64_t n, int size) { return (n + size - 1) / size; }

void quantized_all_reduce(PeerComm& pc, float* buf, int64_t n, float* err1, float* err2,
                          const QuantSpec& q, float scale, int tag) {
  const int P = pc.size(), me = pc.rank();
  if (P == 1) {  // nothing moves: the value is exact (times scale)
    if (scale != 1.f)
      for (int64_t i = 0; i < n; ++i) buf[i] *= scale;
    return;
  }
  const int64_t c = quant_ar_chunk(n, P), padded = c * P;
  // padded copies: the input (and its residual) in P chunks of c
  Buffer in(static_cast<size_t>(padded) * 4, Mem::Communication);
  float* x = in.f32();
  std::memcpy(x, buf, static_cast<size_t>(n) * 4);
  std::memset(x + n, 0, static_cast<size_t>(padded - n) * 4);
  Buffer e1;
  float* e = nullptr;
  if (err1) {
    e1 = Buffer(static_cast<size_t>(padded) * 4, Mem::Communication);
    e = e1.f32();
    std::memcpy(e, err1, static_cast<size_t>(n) * 4);
    std::memset(e + n, 0, static_cast<size_t>(padded - n) * 4);
  }
  Buffer red(static_cast<size_t>(c) * 4, Mem::Communication);
  quantized_reduce_scatter(pc, x, e, red.f32(), c, q, scale, tag);
  if (err1) std::memcpy(err1, e, static_cast<size_t>(n) * 4);
  // gather stage: this rank's reduced chunk, requantised with its own residual, to everyone
  const int64_t pb = quant_packed_bytes(c, q);
  Buffer wire(static_cast<size_t>(pb * P), Mem::Communication);
  uint8_t* w = wire.as<uint8_t>();
  quantize_ef(red.f32(), err2, c, q, w + me * pb);
  std::vector<Work> ws;
  for (int j = 0; j < P; ++j)
    if (j != me) ws.push_back(pc.recv(w + j * pb, pb, j, tag + 1));
  for (int j = 0; j < P; ++j)
    if (j != me) ws.push_back(pc.send(w + me * pb, pb, j, tag + 1));
  wait_all(ws);
  for (int j = 0; j < P; ++j) {
    const int64_t lo = j * c, m = std::min(n, lo + c) - lo;
    if (m <= 0) break;
    if (m == c) {
      dequantize(w + j * pb, c, q, buf + lo);
    } else {  // the last chunk is partly padding
      std::vector<float> t(static_cast<size_t>(c));
      dequantize(w + j * pb, c, q, t.data());
      std::memcpy(buf + lo, t.data(), static_cast<size_t>(m) * 4);
    }
  }
}

QuantWorker::QuantWorker(std::function<void()> on_start)
    : thread_([this, f = std::move(on_start)] { loop(f); }) {}

QuantWorker::~QuantWorker() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Work QuantWorker::issue(std::function<void()> fn) {
  auto st = std::make_shared<detail::WorkState>();
  {
    std::lock_guard<std::mutex> l(mu_);
    q_.emplace_back(std::move(fn), st);
  }
  cv_.notify_all();
  return Work(st);
}

void QuantWorker::loop(const std::function<void()>& on_start) {
  if (on_start) on_start();
  for (;;) {
    std::pair<std::function<void()>, std::shared_ptr<detail::WorkState>> job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;  // (stop_: only once everything issued has run)
      job = std::move(q_.front());
      q_.pop_front();
    }
    job.second->t_start = std::chrono::duration<double>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
    std::string err;
    try {
      job.first();
    } catch (const std::exception& e) {
      err = e.what();
    } catch (...) {
      err = "comm: a quantised collective failed";
    }
    job.second->complete(std::move(err));
  }
}

}  // namespace sw
