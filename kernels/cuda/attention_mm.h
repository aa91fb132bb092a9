// The cuBLAS attention path's orchestration (bf16 / fp16 compute; CudaOps with
// SHARDWISE_CUDA_ATTENTION=cublas): which products and row kernels run, on which strides, in
// which order. Plain C++ over a backend `Be`, so that the same code runs with CudaOps' (cuBLAS
// strided-batched products, attention_mm.cu's kernels) and with a host twin in the tests
// (tests/cuda/test_attention_mm.cpp: serial loops with the same formulas), which checks every
// stride, offset and chunk boundary against the CPU's attention without a GPU.
//
// Layouts: the heads packed into dense 16-bit matrices, Qn and dOn (B*H, T, hd), Kn and Vn
// (B*KVH, T, hd). Queries go in chunks of nq rows, each against keys 0..kend-1 (kend: the
// chunk's last row + 1). A product batches over y = (b, kv head) for one member j of the kv
// group at a time, so query head z = y*G + j (= b*H + h): no two members of a batch write the
// same memory, and every operand's stride is uniform. Forward per chunk: S = Q K^T (fp32);
// softmax_fwd forms the 16-bit P over 256-key tiles as kernels/cpu/attention.cpp does (running
// max after each tile, P rounded against it, the sum of the unrounded P, rescale factors
// alpha); P V per tile (fp32 Ot); combine replays the CPU's rescale recurrence over the tiles
// and divides by l. Backward: D = rowsum(dO * O) (fp32); per chunk S and dP = dO V^T, then
// softmax_bwd (P = exp(scale S - lse), dS = scale P (dP - D), both rounded), dQ = dS K
// (each chunk owns its rows), dK += dS^T Q, dV += P^T dO (fp32 accumulators zeroed
// first, added chunk by chunk, j by j: a fixed order); unpack adds them into dqkv (the op
// accumulates, as the CPU's does).
//
// Be provides: ws16(slot, n) / ws32(slot, n) (grow-only scratch per Slot), pack, gemm (the
// row-major product of 16-bit operands into fp32 C = alpha op(A) op(B) + beta C, `batch`
// times with element strides), softmax_fwd, combine, rowdot, softmax_bwd, unpack, zero, and
// chunk_budget() (bytes) and forced_chunk() (rows, 0: none).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace sw::attn_mm {

enum Slot { kPack, kS, kP, kAcc };
constexpr int kTile = 256;  // keys per softmax tile (kernels/cpu/attention.cpp kFwdBK)

inline int ld_scores(int kend) { return (kend + 7) / 8 * 8; }

// Query rows per chunk: each row of the Z heads takes per_score bytes for each of the
// ld_scores(T) keys and per_row more; within budget, a multiple of 64 (at least 64), or
// `forced` rows when it is not 0.
inline int chunk_rows(size_t Z, int T, size_t per_score, size_t per_row, size_t budget,
                      int forced) {
  const size_t row = Z * (per_score * static_cast<size_t>(ld_scores(T)) + per_row);
  size_t nq = forced > 0 ? static_cast<size_t>(forced) : budget / std::max<size_t>(row, 1);
  if (forced <= 0) nq = nq >= 64 ? nq / 64 * 64 : 64;
  return static_cast<int>(std::min<size_t>(nq, static_cast<size_t>(T)));
}

template <class Be>
void forward(const Be& be, float* out, float* lse, const float* qkv, int B, int T, int H, int KVH,
             int hd) {
  if (B <= 0 || T <= 0) return;
  const int R = (H + 2 * KVH) * hd, G = H / KVH;
  const size_t Z = size_t(B) * H, ZK = size_t(B) * KVH, Th = size_t(T) * hd;
  uint16_t* Qn = be.ws16(kPack, (Z + 2 * ZK) * Th);
  uint16_t* Kn = Qn + Z * Th;
  uint16_t* Vn = Kn + ZK * Th;
  be.pack(qkv, B, T, R, 0, H, hd, Qn);
  be.pack(qkv, B, T, R, H * hd, KVH, hd, Kn);
  be.pack(qkv, B, T, R, (H + KVH) * hd, KVH, hd, Vn);
  const int max_tiles = (T + kTile - 1) / kTile;
  const int nq = chunk_rows(Z, T, 6, size_t(max_tiles) * (4 * size_t(hd) + 4) + 8,
                            be.chunk_budget(), be.forced_chunk());
  const int ldmax = ld_scores(T);
  // Sized once for the largest chunk (a grow-only slot may move when it grows).
  float* S = be.ws32(kS, Z * nq * ldmax);
  uint16_t* P = be.ws16(kP, Z * nq * ldmax);
  float* acc = be.ws32(kAcc, Z * nq * (size_t(max_tiles) * (hd + 1) + 2));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int q0 = 0; q0 < T; q0 += nq) {
    const int rows = std::min(nq, T - q0), kend = q0 + rows, ldS = ld_scores(kend);
    const int tiles = (kend + kTile - 1) / kTile;
    const size_t zr = Z * rows, cs = size_t(rows) * ldS;
    float* Ot = acc;
    float* alpha = Ot + size_t(tiles) * zr * hd;
    float* ml = alpha + zr * tiles;
    for (int j = 0; j < G; ++j)  // S[z] = Q[z] K[y]^T, z = y*G + j
      be.gemm(false, true, rows, kend, hd, Qn + j * Th + size_t(q0) * hd, hd, G * Th, Kn, hd, Th,
              0.f, S + j * cs, ldS, G * cs, ZK);
    be.softmax_fwd(S, P, alpha, ml, zr, rows, ldS, kend, q0, tiles, scale);
    for (int t = 0; t < tiles; ++t) {
      const int k0 = t * kTile, kt = std::min(kTile, kend - k0);
      for (int j = 0; j < G; ++j)  // Ot[t][z] = P[z][:, k0:k0+kt] V[y][k0:k0+kt]
        be.gemm(false, false, rows, hd, kt, P + j * cs + k0, ldS, G * cs, Vn + size_t(k0) * hd,
                hd, Th, 0.f, Ot + (size_t(t) * zr + size_t(j) * rows) * hd, hd,
                size_t(G) * rows * hd, ZK);
    }
    be.combine(Ot, alpha, ml, out, lse, zr, rows, hd, tiles, T, H, q0);
  }
}

template <class Be>
void backward(const Be& be, float* dqkv, const float* dout, const float* qkv, const float* out,
              const float* lse, int B, int T, int H, int KVH, int hd) {
  if (B <= 0 || T <= 0) return;
  const int R = (H + 2 * KVH) * hd, G = H / KVH;
  const size_t Z = size_t(B) * H, ZK = size_t(B) * KVH, Th = size_t(T) * hd;
  uint16_t* Qn = be.ws16(kPack, (2 * Z + 2 * ZK) * Th);
  uint16_t* Kn = Qn + Z * Th;
  uint16_t* Vn = Kn + ZK * Th;
  uint16_t* dOn = Vn + ZK * Th;
  be.pack(qkv, B, T, R, 0, H, hd, Qn);
  be.pack(qkv, B, T, R, H * hd, KVH, hd, Kn);
  be.pack(qkv, B, T, R, (H + KVH) * hd, KVH, hd, Vn);
  be.pack(dout, B, T, H * hd, 0, H, hd, dOn);  // (D below is from the unrounded dout)
  float* D = be.ws32(kAcc, Z * T + (Z + 2 * ZK) * Th);
  float* dQn = D + Z * T;
  float* dKn = dQn + Z * Th;
  float* dVn = dKn + ZK * Th;
  be.rowdot(dout, out, D, B, T, H, hd);
  be.zero(dKn, 2 * ZK * Th);
  const int nq = chunk_rows(Z, T, 12, 0, be.chunk_budget(), be.forced_chunk());
  const int ldmax = ld_scores(T);
  float* S = be.ws32(kS, 2 * Z * nq * ldmax);
  uint16_t* P = be.ws16(kP, 2 * Z * nq * ldmax);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int q0 = 0; q0 < T; q0 += nq) {
    const int rows = std::min(nq, T - q0), kend = q0 + rows, ldS = ld_scores(kend);
    const size_t zr = Z * rows, cs = size_t(rows) * ldS;
    float* dP = S + zr * ldS;
    uint16_t* dS = P + zr * ldS;
    for (int j = 0; j < G; ++j) {
      const size_t qa = j * Th + size_t(q0) * hd;  // query head j's chunk rows in Qn / dOn
      be.gemm(false, true, rows, kend, hd, Qn + qa, hd, G * Th, Kn, hd, Th, 0.f, S + j * cs, ldS,
              G * cs, ZK);
      be.gemm(false, true, rows, kend, hd, dOn + qa, hd, G * Th, Vn, hd, Th, 0.f, dP + j * cs,
              ldS, G * cs, ZK);
    }
    be.softmax_bwd(S, dP, P, dS, lse, D, zr, rows, ldS, kend, q0, T, scale);
    for (int j = 0; j < G; ++j) {
      const size_t qa = j * Th + size_t(q0) * hd;
      be.gemm(false, false, rows, hd, kend, dS + j * cs, ldS, G * cs, Kn, hd, Th, 0.f,
              dQn + qa, hd, G * Th, ZK);
      be.gemm(true, false, kend, hd, rows, dS + j * cs, ldS, G * cs, Qn + qa, hd, G * Th, 1.f,
              dKn, hd, Th, ZK);
      be.gemm(true, false, kend, hd, rows, P + j * cs, ldS, G * cs, dOn + qa, hd, G * Th, 1.f,
              dVn, hd, Th, ZK);
    }
  }
  be.unpack(dQn, dKn, dVn, dqkv, B, T, H, KVH, hd);
}

}  // namespace sw::attn_mm
