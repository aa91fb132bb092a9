// BF16 GEMM through oneDNN's matmul (libdnnl, Debian's 2.x build on the GNU OpenMP runtime, so
// it runs on our OpenMP pool with omp_get_max_threads() threads, as kernels/threads.h sets):
// C(fp32) = alpha * op(A) @ op(B) + beta * C with A and B rounded to bf16 exactly as
// core/dtype.h f32_to_bf16 does (to_bf16_rows, gemm_bf16_avx512.cpp), fp32 accumulation.
//
// The operands are converted into dense bf16 copies in per-thread workspaces (kept between
// calls) in one parallel region, in their own layout: a transpose is a stride in the memory
// descriptor, not a copy. An operand given in bf16 already (A16 / B16: the Ops' 16-bit
// activations and a mixed-precision unit's bf16 weights) is read where it lies, with its own
// leading dimension: no conversion at all (issue 39: widening those to fp32 and converting
// them back cost ~10% of the small bf16 model's step). oneDNN's own f32->bf16 reorder is not used because its AVX512-BF16
// conversion (vcvtneps2bf16) flushes subnormal inputs to zero, which f32_to_bf16 does not.
// Nothing is cached between calls but the primitives: weights change every optimizer step.
//
// alpha is the matmul's output scale and beta a sum post-op (dst = alpha * acc + beta * dst),
// both fixed at primitive creation, so they are part of the cache key with the shape,
// transposes, ldc and the thread count (a oneDNN CPU primitive is planned for the number of
// threads it will run on). oneDNN splits the work statically for a given thread count, so
// results are bit-identical run to run at a fixed thread count (tests/kernels/test_bf16.cpp).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <dnnl.hpp>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/alloc.h"
#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/cpu_kernels.h"

namespace sw::cpu::detail {

namespace {

struct Key {
  int M, N, K, lda, ldb, ldc, threads;  // lda / ldb: the bf16 operands' (dense copies: their width)
  bool ta, tb;
  bool bias, c16;        // a bias row; a bf16 C
  uint32_t alpha, beta;  // bit patterns
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t v : {(uint64_t)k.M, (uint64_t)k.N, (uint64_t)k.K, (uint64_t)k.lda,
                       (uint64_t)k.ldb, (uint64_t)k.ldc,
                       (uint64_t)k.threads, (uint64_t)(k.ta * 2 + k.tb + 4 * k.bias + 8 * k.c16), (uint64_t)k.alpha,
                       (uint64_t)k.beta})
      h = (h ^ v) * 1099511628211ull;
    return h;
  }
};

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::matmul primitive(const Key& k) {
  static std::mutex mu;
  static std::unordered_map<Key, dnnl::matmul, KeyHash> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(k);
  if (it != cache.end()) return it->second;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  // op(A) is (M, K): A is stored (M, K) row-major, or (K, M) when transposed.
  const dnnl::memory::desc a({k.M, k.K}, dt::bf16, k.ta ? dims{1, k.lda} : dims{k.lda, 1});
  const dnnl::memory::desc b({k.K, k.N}, dt::bf16, k.tb ? dims{1, k.ldb} : dims{k.ldb, 1});
  const dnnl::memory::desc c({k.M, k.N}, k.c16 ? dt::bf16 : dt::f32, dims{k.ldc, 1});
  dnnl::primitive_attr attr;
  float alpha, beta;
  std::memcpy(&alpha, &k.alpha, 4);
  std::memcpy(&beta, &k.beta, 4);
  if (alpha != 1.f) attr.set_output_scales(0, {alpha});
  if (beta != 0.f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc pd;
  try {
    const dnnl::matmul::desc d =
        k.bias ? dnnl::matmul::desc(a, b, dnnl::memory::desc({1, k.N}, dt::f32, dims{k.N, 1}), c)
               : dnnl::matmul::desc(a, b, c);
    pd = dnnl::matmul::primitive_desc(d, attr, engine());
  } catch (const dnnl::error& e) {
    fail("kernels", std::string("oneDNN bf16 matmul: no implementation (") + e.what() + ")");
  }
  return cache.emplace(k, dnnl::matmul(pd)).first->second;
}

uint16_t* workspace(int slot, size_t elems) {
  thread_local Buffer buf[2];
  return reinterpret_cast<uint16_t*>(grow_workspace(buf[slot], (elems + 1) / 2));
}

}  // namespace

void gemm_bf16_onednn(bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                      int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  gemm_bf16_onednn(ta, tb, M, N, K, alpha, A, nullptr, lda, B, nullptr, ldb, beta, C, ldc);
}

void gemm_bf16_onednn(bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                      const uint16_t* A16, int lda, const float* B, const uint16_t* B16, int ldb,
                      float beta, float* C, int ldc) {
  gemm_bf16_onednn(ta, tb, M, N, K, alpha, A, A16, lda, B, B16, ldb, beta, C, ldc, nullptr,
                   nullptr);
}

void gemm_bf16_onednn(bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                      const uint16_t* A16, int lda, const float* B, const uint16_t* B16, int ldb,
                      float beta, float* C, int ldc, const float* bias, uint16_t* C16) {
  if (M <= 0 || N <= 0) return;
  SW_CHECK(!C16 || (!C && beta == 0.f), "gemm_bf16_onednn: a bf16 C is written, not added into");
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  uint32_t ab, bb;
  const float beta0 = beta == 0.f ? 0.f : beta;  // -0 and +0 are the same primitive
  std::memcpy(&ab, &alpha, 4);
  std::memcpy(&bb, &beta0, 4);
  const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  const dnnl::matmul mm =
      primitive({M, N, K, A16 ? lda : ac, B16 ? ldb : bc, ldc, threads, ta, tb, bias != nullptr,
                 C16 != nullptr, ab, bb});

  // Both conversions in one pass, rows of A then rows of B; on the calling thread unless the
  // operands are huge (the LM head's weights): converting runs at ~15 GB/s of fp32 on one
  // core (2.5M elements in 0.7 ms), while opening a parallel region on this shared 2-core
  // machine cost 10-15 ms (the other thread has to be scheduled), more than the product's
  // conversion time. Above 16M elements both threads split it statically.
  // (an operand given in bf16 has no blocks to convert)
  uint16_t* a16 = A16 ? nullptr : workspace(0, (size_t)ar * ac);
  uint16_t* b16 = B16 ? nullptr : workspace(1, (size_t)br * bc);
  constexpr int kRows = 16;
  const long ablk = A16 ? 0 : (ar + kRows - 1) / kRows;
  const long nblk = ablk + (B16 ? 0 : (br + kRows - 1) / kRows);
  const size_t elems = (A16 ? 0 : (size_t)ar * ac) + (B16 ? 0 : (size_t)br * bc);
#pragma omp parallel for schedule(static) if (elems >= (1u << 24) && threads > 1)
  for (long q = 0; q < nblk; ++q) {
    if (q < ablk) {
      const int r0 = (int)q * kRows, n = std::min(kRows, ar - r0);
      to_bf16_rows(a16 + (size_t)r0 * ac, A + (size_t)r0 * lda, n, ac, lda);
    } else {
      const int r0 = (int)(q - ablk) * kRows, n = std::min(kRows, br - r0);
      to_bf16_rows(b16 + (size_t)r0 * bc, B + (size_t)r0 * ldb, n, bc, ldb);
    }
  }

  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  dnnl::engine& eng = engine();
  const int la = A16 ? lda : ac, lb = B16 ? ldb : bc;
  void* ap = A16 ? const_cast<uint16_t*>(A16) : a16;  // (oneDNN only reads its source)
  void* bp = B16 ? const_cast<uint16_t*>(B16) : b16;
  const dnnl::memory am({{M, K}, dt::bf16, ta ? dims{1, la} : dims{la, 1}}, eng, ap);
  const dnnl::memory bm({{K, N}, dt::bf16, tb ? dims{1, lb} : dims{lb, 1}}, eng, bp);
  const dnnl::memory cm({{M, N}, C16 ? dt::bf16 : dt::f32, dims{ldc, 1}}, eng,
                        C16 ? static_cast<void*>(C16) : static_cast<void*>(C));
  thread_local dnnl::stream strm(eng);
  if (bias) {
    const dnnl::memory biasm({{1, N}, dt::f32, dims{N, 1}}, eng, const_cast<float*>(bias));
    mm.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_BIAS, biasm},
                      {DNNL_ARG_DST, cm}});
  } else {
    mm.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  }
  strm.wait();
}

// The own kernel for A read in place packs all of B (K x N) on every call: at fewer rows than
// own16::kMinRows (1024) it ran slower than oneDNN (the 512-row LM-head chunk x w^T: 0.84x; the
// step's Linears at 1024 and 2048 rows: 0.98-1.11x, bench/bench_gemm16 --rows 1024 / 2048),
// unless a ReusePackedB scope spares the packing after the first call.

bool own16_kernels() {
  static const bool own = cpu_has_avx512_bf16() && !lowp_onednn_forced();
  return own;
}

void gemm_bf16_16(bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                  const uint16_t* A16, int lda, const float* B, const uint16_t* B16, int ldb,
                  float beta, float* C, int ldc, const float* bias, uint16_t* C16) {
  static const bool own = own16_kernels();
  if (own && A16 && B16 && !(ta && tb)) {
    if (ta) {
      if (!bias && !C16)
        return gemm_bf16_tn16_avx512(M, N, K, alpha, A16, lda, B16, ldb, beta, C, ldc);
    } else if ((M >= own16::kMinRows || reuse_packed_b(N, K)) &&
               gemm_bf16_n16_avx512(tb, M, N, K, alpha, A16, lda, B16, ldb, beta, C, ldc, bias,
                                    C16)) {
      return;
    }
  }
  gemm_bf16_onednn(ta, tb, M, N, K, alpha, A, A16, lda, B, B16, ldb, beta, C, ldc, bias, C16);
}

bool gemm_bf16_16_dw_db(int M, int N, int K, const uint16_t* A16, int lda, const uint16_t* B16,
                        int ldb, float beta, float* C, int ldc, float* db, bool db_write) {
  if (!own16_kernels() || !A16 || !B16) return false;
  gemm_bf16_tn16_avx512(M, N, K, 1.f, A16, lda, B16, ldb, beta, C, ldc, db, db_write);
  return true;
}

}  // namespace sw::cpu::detail

namespace sw::cpu {

// The buffers of gemm_bf16_tn.cpp as its kernels size them (words of 4 bytes, grown to the
// largest request), for the calls gemm_bf16_16 above hands them (both operands in bf16 is the
// caller's promise), with the gates of gemm_bf16_n16_avx512 that return before packing (an odd
// K; a bf16 output over more than one K block) and its slots' least-recently-used refill.
int64_t own16_pack_bytes(const std::vector<Own16Call>& calls, int threads) {
  if (!detail::own16_kernels()) return 0;
  size_t tn_b = 0;  // words: the tn kernel's packed B (the n16 kernel's: slot 0, also per call)
  int a_threads = 0;           // team threads that packed a tn A block
  struct Slot {
    bool held = false;  // a packed form kept in a live scope
    int N = 0, K = 0;
    bool tb = false;
    unsigned long use = 0;
    size_t words = 0;
  } slot[2];
  unsigned long uses = 0;
  int scope = 0;
  auto keep = [](int N, int K) {
    return size_t((K + 1) / 2) * detail::own16::panels_pad(N) * 4 <= detail::own16::kReuseMaxBytes;
  };
  for (const Own16Call& c : calls) {
    if (c.scope != scope) {  // leaving a scope forgets the kept forms (ReusePackedB's end)
      if (scope != 0) slot[0].held = slot[1].held = false;
      scope = c.scope;
    }
    if (c.M <= 0 || c.N <= 0 || c.K <= 0 || (c.ta && c.tb)) continue;
    if (c.ta) {
      if (c.c16) continue;  // (oneDNN's)
      tn_b = std::max(tn_b, size_t((c.K + 1) / 2) * detail::own16::panels_pad(c.N));
      const bool team = 2.0 * c.M * c.N * c.K >= detail::own16::kMinWork;
      a_threads = std::max(a_threads, team ? std::max(1, threads) : 1);
      continue;
    }
    const bool kept = scope != 0 && keep(c.N, c.K);
    if (!(c.M >= detail::own16::kMinRows || kept)) continue;
    const int Kp = c.K / 2;
    if (c.K % 2 || (c.c16 && Kp > detail::own16::kKPn)) continue;  // (the kernel declines)
    const size_t words = size_t(Kp) * detail::own16::panels_pad(c.N);
    if (!kept) {
      slot[0].held = false;
      slot[0].words = std::max(slot[0].words, words);
      continue;
    }
    Slot* s = nullptr;
    for (Slot& x : slot)
      if (x.held && x.tb == c.tb && x.N == c.N && x.K == c.K) s = &x;
    if (!s) {
      s = slot[0].use <= slot[1].use ? &slot[0] : &slot[1];
      s->held = true, s->tb = c.tb, s->N = c.N, s->K = c.K;
    }
    s->use = ++uses;
    s->words = std::max(s->words, words);
  }
  const size_t a_words = size_t(detail::own16::kMC) * detail::own16::kKP;
  return 4 * int64_t(tn_b + slot[0].words + slot[1].words + size_t(a_threads) * a_words);
}

}  // namespace sw::cpu
