#include "sharding/comm/quantize.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace sw {

namespace {

int64_t nblocks(int64_t n, const QuantSpec& q) { return (n + q.block - 1) / q.block; }
int64_t code_bytes(int64_t n, const QuantSpec& q) { return q.bits == 4 ? (n + 1) / 2 : n; }

void check_spec(const QuantSpec& q) {
  SW_CHECK((q.bits == 8 || q.bits == 4) && q.block >= 1, "quantize: bits must be 8 or 4, block >= 1");
}

// Round half to even, independent of the FP environment's rounding mode.
inline int round_even(float v) {
  const float f = std::floor(v);
  const float d = v - f;
  int r = static_cast<int>(f);
  if (d > 0.5f || (d == 0.5f && (r & 1))) ++r;
  return r;
}

// One block: its scale, and code(i) for each of its values (written by `put`).
template <class Put>
float quantize_block(const float* x, int64_t m, int qmax, Put put) {
  float amax = 0.f;
  bool finite = true;
  for (int64_t i = 0; i < m; ++i) {
    const float a = std::fabs(x[i]);
    if (!(a <= 3.4e38f)) finite = false;  // NaN or infinity
    amax = a > amax ? a : amax;
  }
  if (!finite) {
    for (int64_t i = 0; i < m; ++i) put(i, 0);
    return std::nanf("");
  }
  if (amax == 0.f) {
    for (int64_t i = 0; i < m; ++i) put(i, 0);
    return 0.f;
  }
  const float scale = amax / static_cast<float>(qmax);
  const float inv = static_cast<float>(qmax) / amax;
  for (int64_t i = 0; i < m; ++i) {
    int c = round_even(x[i] * inv);
    c = c > qmax ? qmax : (c < -qmax ? -qmax : c);
    put(i, c);
  }
  return scale;
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
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t b = 0; b < B; ++b) {
    const float s = scales[b];
    const int64_t lo = b * q.block, hi = std::min(n, lo + q.block);
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
  const int64_t b = nblocks(n, q) * 4 + code_bytes(n, q);
  return (b + 3) / 4 * 4;
}

void quantize(const float* x, int64_t n, const QuantSpec& q, void* out) {
  check_spec(q);
  const int64_t B = nblocks(n, q);
  float* scales = static_cast<float*>(out);
  uint8_t* codes = reinterpret_cast<uint8_t*>(scales + B);
  // int4 packs two codes per byte: blocks of odd length would share a byte between two
  // blocks, so the nibbles of each byte are written by the block that owns the byte's first
  // value (blocks are processed in pairs of bytes by one thread when block is odd).
  const bool serial = q.bits == 4 && (q.block & 1);
  const int qmax = q.qmax();
  const int64_t tail = quant_packed_bytes(n, q) - B * 4 - code_bytes(n, q);
  std::memset(codes + code_bytes(n, q), 0, static_cast<size_t>(tail));
  if (q.bits == 4 && (n & 1)) codes[n >> 1] = 0;  // the unused high nibble
#pragma omp parallel for schedule(static) if (n > (1 << 16) && !serial)
  for (int64_t b = 0; b < B; ++b) {
    const int64_t lo = b * q.block, m = std::min(n, lo + q.block) - lo;
    if (q.bits == 8) {
      scales[b] = quantize_block(x + lo, m, qmax, [&](int64_t i, int c) {
        codes[lo + i] = static_cast<uint8_t>(static_cast<int8_t>(c));
      });
    } else {
      scales[b] = quantize_block(x + lo, m, qmax, [&](int64_t i, int c) {
        const int64_t k = lo + i;
        uint8_t& byte = codes[k >> 1];
        const uint8_t nib = static_cast<uint8_t>(c & 0xF);
        byte = (k & 1) ? static_cast<uint8_t>((byte & 0x0F) | (nib << 4))
                       : static_cast<uint8_t>((byte & 0xF0) | nib);
      });
    }
  }
}

void dequantize(const void* in, int64_t n, const QuantSpec& q, float* y) {
  dequant<false>(in, n, q, y);
}

void dequantize_add(const void* in, int64_t n, const QuantSpec& q, float* y) {
  dequant<true>(in, n, q, y);
}

void quantize_ef(const float* x, float* err, int64_t n, const QuantSpec& q, void* out) {
  if (!err) return quantize(x, n, q, out);
  if (x != err)
    for (int64_t i = 0; i < n; ++i) err[i] += x[i];  // err := x + err (what is sent)
  quantize(err, n, q, out);
  // err := x' - DQ(Q(x')), block by block without a second buffer
  const float* scales = static_cast<const float*>(out);
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(scales + nblocks(n, q));
  for (int64_t i = 0; i < n; ++i)
    err[i] -= static_cast<float>(code_at(codes, i, q.bits)) * scales[i / q.block];
}

Work issue_quantized_all_gather(Group& g, const float* shard, int64_t n, const QuantSpec& q,
                                Buffer& wire) {
  const int64_t pb = quant_packed_bytes(n, q);
  const size_t need = static_cast<size_t>(pb) * static_cast<size_t>(g.size());
  if (wire.bytes() < need) wire = Buffer(need, Mem::Communication);
  uint8_t* w = wire.as<uint8_t>();
  quantize(shard, n, q, w + g.rank() * pb);
  // raw bytes as f32 elements, in place
  return g.issue_all_gather(w + g.rank() * pb, w, pb / 4, DType::F32);
}

void finish_quantized_all_gather(const Group& g, const Buffer& wire, int64_t n,
                                 const QuantSpec& q, float* out) {
  const int64_t pb = quant_packed_bytes(n, q);
  const uint8_t* w = wire.as<uint8_t>();
  for (int r = 0; r < g.size(); ++r) dequantize(w + r * pb, n, q, out + r * n);
}

void quantized_reduce_scatter(PeerComm& pc, const float* in, float* err, float* out, int64_t n,
                              const QuantSpec& q, float scale, int tag) {
  const int P = pc.size(), me = pc.rank();
  const int64_t pb = quant_packed_bytes(n, q);
  Buffer send(static_cast<size_t>(pb * P), Mem::Communication);
  Buffer recv(static_cast<size_t>(pb * P), Mem::Communication);
  uint8_t* s = send.as<uint8_t>();
  uint8_t* r = recv.as<uint8_t>();
  std::vector<Work> w;
  // Receives first, then each block quantised and sent as soon as it is ready.
  for (int j = 0; j < P; ++j)
    if (j != me) w.push_back(pc.recv(r + j * pb, pb, j, tag));
  for (int k = 1; k <= P; ++k) {
    const int j = (me + k) % P;  // the own block last: it lands directly in its slot
    uint8_t* dst = j == me ? r + j * pb : s + j * pb;
    quantize_ef(in + j * n, err ? err + j * n : nullptr, n, q, dst);
    if (j != me) w.push_back(pc.send(dst, pb, j, tag));
  }
  wait_all(w);
  // out := scale * sum in rank order (out may be in's own block, already quantised)
  dequantize(r, n, q, out);
  for (int j = 1; j < P; ++j) dequantize_add(r + j * pb, n, q, out);
  if (scale != 1.f)
    for (int64_t i = 0; i < n; ++i) out[i] *= scale;
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

}  // namespace sw
