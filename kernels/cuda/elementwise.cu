// Element-wise and gather/scatter kernels of the CUDA backend: embedding, GELU, SwiGLU,
// residual, RoPE, AdamW, the vector utilities, the fixed-order sums (sum_squares, the loss
// total) and the per-row softmax / cross-entropy pass of the fused LM head.
// The formulas are those of the CPU twin (kernels/cpu/elementwise.cpp, rope.cpp, adamw.cpp,
// embedding.cpp, lmhead.cpp), with expf in place of the CPU's polynomial exp.
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"

namespace sw::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kGeluA = 0.044715f;

__device__ __forceinline__ float clampf(float x, float lo, float hi) {
  return x < lo ? lo : (x > hi ? hi : x);  // NaN passes through, as on the CPU
}

// ---- Four elements per access -----------------------------------------------------------------
// With one float per thread a streaming kernel keeps too few bytes in flight to fill the
// memory's bandwidth (about a third of an H200's; fill measured ~1 TB/s on the first H200 run,
// 2026-11-27). Where every pointer is aligned to a 16-byte vector of floats (8 bytes for four
// 16-bit values), each thread moves four elements per load and store (each4); a count that is
// not a multiple of four leaves a tail to the scalar kernel. Each element goes through the same
// formula as in the scalar kernel (the shared __device__ functions below), so the bits are the
// same.
template <class F>
__global__ void each4_k(size_t n4, F f) {
  for (size_t g = blockIdx.x * size_t(blockDim.x) + threadIdx.x; g < n4;
       g += size_t(gridDim.x) * blockDim.x)
    f(g * 4);
}
template <class F>
void each4(cudaStream_t s, size_t n4, F f) {
  if (n4 == 0) return;
  each4_k<<<grid_for(n4, kThreads), kThreads, 0, s>>>(n4, f);
  SW_CUDA_LAUNCHED();
}
inline bool al16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
inline bool al8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }
inline bool al4(const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; }

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ ushort4 ldh4(const uint16_t* p) {
  return *reinterpret_cast<const ushort4*>(p);
}
__device__ __forceinline__ void sth4(uint16_t* p, ushort4 v) { *reinterpret_cast<ushort4*>(p) = v; }
__device__ __forceinline__ ushort4 narrow4(int dt, float4 f) {
  return make_ushort4(to_half_d(dt, f.x), to_half_d(dt, f.y), to_half_d(dt, f.z),
                      to_half_d(dt, f.w));
}
__device__ __forceinline__ float4 widen4(int dt, ushort4 h) {
  return make_float4(from_half_d(dt, h.x), from_half_d(dt, h.y), from_half_d(dt, h.z),
                     from_half_d(dt, h.w));
}
// An input read as fp32: the float itself, or a 16-bit value (dt) widened.
__device__ __forceinline__ float ldv(int, const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float ldv(int dt, const uint16_t* p, size_t i) {
  return from_half_d(dt, p[i]);
}
__device__ __forceinline__ float4 ldv4(int, const float* p) { return ld4(p); }
__device__ __forceinline__ float4 ldv4(int dt, const uint16_t* p) { return widen4(dt, ldh4(p)); }
// The four-wide forms' alignment of such an input.
inline bool al_in(const float* p) { return al16(p); }
inline bool al_in(const uint16_t* p) { return al8(p); }

__device__ __forceinline__ float gelu_f(float x) {
  const float xc = clampf(x, -10.f, 10.f);
  const float u = kSqrt2OverPi * xc * (1.f + kGeluA * xc * xc);
  return x / (1.f + expf(-2.f * u));
}
// d(gelu)/dx at x, times dout (the CPU twin's order).
__device__ __forceinline__ float gelu_grad_f(float xin, float dout) {
  const float x = clampf(xin, -10.f, 10.f);
  const float x2 = x * x;
  const float u = kSqrt2OverPi * x * (1.f + kGeluA * x2);
  const float du = kSqrt2OverPi * (1.f + 3.f * kGeluA * x2);
  const float e = expf(-2.f * u);
  const float sg = 1.f / (1.f + e);
  return dout * (sg + 2.f * x * du * (e * sg) * sg);
}
// e^-g with the argument clamped to [-80, 80] as the CPU's exp_clamped clamps it: below a gate
// of about -88.7 expf(-g) is +inf, and e * sg below would be inf * 0 = NaN.
__device__ __forceinline__ float exp_neg_clamped(float g) {
  return expf(clampf(-g, -80.f, 80.f));
}
__device__ __forceinline__ float swiglu_f(float g, float up) {
  return g / (1.f + exp_neg_clamped(g)) * up;
}
// dgate and dup of one element: dgu[gate] += *dg, dgu[up] += *du.
__device__ __forceinline__ void swiglu_grad_f(float g, float up, float d, float* dg, float* du) {
  const float e = exp_neg_clamped(g);
  const float sg = 1.f / (1.f + e);
  *du = d * g * sg;
  *dg = d * up * sg * (1.f + g * (e * sg));
}

// ---- Embedding ------------------------------------------------------------------------------

// A table value as fp32: itself, or (16-bit table, dt 1 bf16, 2 f16) widened.
__device__ __forceinline__ float table_value(const float* t, size_t i, int) { return t[i]; }
__device__ __forceinline__ float table_value(const uint16_t* t, size_t i, int dt) {
  return from_half_d(dt, t[i]);
}
// out(B,T,C) = wte[tokens[b,t]] + wpe[t] (wpe may be null), the table fp32 or 16-bit.
template <class Tab>
__global__ void embedding_forward_k(float* out, const int32_t* tokens, const Tab* wte, int dt,
                                    const float* wpe, int T, int C, size_t total) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t n = i / C;
    const int c = static_cast<int>(i % C);
    const float e = table_value(wte, static_cast<size_t>(tokens[n]) * C + c, dt);
    out[i] = wpe ? e + wpe[static_cast<size_t>(n % T) * C + c] : e;
  }
}

// dwte: thread (c, bucket) walks all B*T rows in order and adds the rows whose token falls in
// its bucket (token % kBuckets) at column c. Every float of dwte has one owner, which adds its
// contributions in row order: the CPU's order exactly, no atomics.
constexpr int kBuckets = 32;
__global__ void embedding_backward_wte_k(float* dwte, const float* dout, const int32_t* tokens,
                                         int BT, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned bucket = blockIdx.y;
  __shared__ int32_t tok[kThreads];
  for (int n0 = 0; n0 < BT; n0 += kThreads) {
    const int cnt = min(kThreads, BT - n0);
    __syncthreads();
    if (threadIdx.x < cnt) tok[threadIdx.x] = tokens[n0 + threadIdx.x];
    __syncthreads();
    if (c < C) {
      for (int r = 0; r < cnt; ++r) {
        const int32_t t = tok[r];
        if (static_cast<unsigned>(t) % kBuckets != bucket) continue;
        dwte[static_cast<size_t>(t) * C + c] += dout[static_cast<size_t>(n0 + r) * C + c];
      }
    }
  }
}

// dwpe[t, c] += sum over b (in order) of dout[b, t, c].
__global__ void embedding_backward_wpe_k(float* dwpe, const float* dout, int B, int T, int C) {
  const size_t total = static_cast<size_t>(T) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    float p = dwpe[i];
    for (int b = 0; b < B; ++b) p += dout[static_cast<size_t>(b) * total + i];
    dwpe[i] = p;
  }
}

// ---- GELU / SwiGLU / residual -----------------------------------------------------------------

__global__ void gelu_forward_k(float* out, const float* inp, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    out[i] = gelu_f(inp[i]);
  }
}

template <class In>  // inp fp32, or 16-bit (dt)
__global__ void gelu_forward_lp_k(int dt, uint16_t* out, const In* inp, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = to_half_d(dt, gelu_f(ldv(dt, inp, i)));
}

template <bool Set, class In, class D>  // inp and dout each fp32, or 16-bit (dt)
__global__ void gelu_backward_k(float* dinp, const In* inp, const D* dout, size_t n,
                                uint16_t* d16, int dt) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float r = (Set ? 0.f : dinp[i]) + gelu_grad_f(ldv(dt, inp, i), ldv(dt, dout, i));
    if (dinp) dinp[i] = r;
    if (d16) d16[i] = to_half_d(dt, r);
  }
}

__global__ void swiglu_forward_k(float* out, const float* gu, int F, size_t total) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t n = i / F, f = i % F;
    out[i] = swiglu_f(gu[n * 2 * F + f], gu[n * 2 * F + F + f]);
  }
}

template <class In>  // gu fp32, or 16-bit (dt)
__global__ void swiglu_forward_lp_k(int dt, uint16_t* out, const In* gu, int F, size_t total) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t n = i / F, f = i % F;
    out[i] = to_half_d(dt, swiglu_f(ldv(dt, gu, n * 2 * F + f), ldv(dt, gu, n * 2 * F + F + f)));
  }
}

template <bool Set>
__global__ void swiglu_backward_k(float* dgu, const float* dout, const float* gu, int F,
                                  size_t total) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t n = i / F, f = i % F;
    const size_t ig = n * 2 * F + f, iu = ig + F;
    float dg, du;
    swiglu_grad_f(gu[ig], gu[iu], dout[i], &dg, &du);
    dgu[iu] = (Set ? 0.f : dgu[iu]) + du;
    dgu[ig] = (Set ? 0.f : dgu[ig]) + dg;
  }
}

// narrow(swiglu_backward_k<true>): each value 0 + g, as the set form stores it (0 + -0 is +0),
// then rounded to dt.
template <class In, class D>  // gu and dout each fp32, or 16-bit (dt)
__global__ void swiglu_backward_lp_k(int dt, uint16_t* dgu, const D* dout, const In* gu,
                                     int F, size_t total) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t n = i / F, f = i % F;
    const size_t ig = n * 2 * F + f, iu = ig + F;
    float dg, du;
    swiglu_grad_f(ldv(dt, gu, ig), ldv(dt, gu, iu), ldv(dt, dout, i), &dg, &du);
    dgu[iu] = to_half_d(dt, 0.f + du);
    dgu[ig] = to_half_d(dt, 0.f + dg);
  }
}

__global__ void residual_k(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

// ---- RoPE -------------------------------------------------------------------------------------

// The angles' table, (T, hd / 2) pairs (cos, sin), as the CPU's table computes them: inv_freq =
// rope_inv_freq (kernels/ops.h, the CPU's function: theta and the llama3 scaling), angle = float(t) * inv_freq in
// float, cos/sin in double rounded once. Built once per (T, hd, RopeSpec) (CudaOps keeps it in a
// scratch slot): computing it per element made RoPE cost 7 ms per direction and step on the
// 1.3B Llama (the first H200 run's op times), several times the bytes it moves.
__global__ void rope_table_k(float2* tab, int T, int hd, RopeSpec rope) {
  const int half = hd / 2;
  const size_t total = static_cast<size_t>(T) * half;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const int t = static_cast<int>(idx / half);
    const float inv_freq = rope_inv_freq(rope, i, hd);
    const float angle = static_cast<float>(t) * inv_freq;
    tab[idx] = make_float2(static_cast<float>(cos(double(angle))),
                           static_cast<float>(sin(double(angle))));
  }
}

// One thread per (row n, head h, P consecutive pairs i); sign -1 rotates back. In place (LP
// false; heads == rot_heads): the q and k heads of qkv. LP: src (fp32, or 16-bit S = uint16_t
// widened from dt) read and dst16 written rounded to dt (cuda::narrow's to_half_d), over all
// `heads` heads: the first rot_heads rotated with the in-place form's arithmetic, the rest (v)
// only rounded. A thread reads its elements before it writes them, and no other thread
// touches them, so a 16-bit src may be dst16 itself.
template <int P, bool LP, class S = float>
__global__ void rope_k(float* qkv, const S* src, uint16_t* dst16, int dt, const float2* tab,
                       int T, int heads, int rot_heads, int hd, size_t row, float sign,
                       size_t total) {
  const int half = hd / 2, groups = half / P;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % groups) * P;
    const size_t nh = idx / groups;
    const int h = static_cast<int>(nh % heads);
    const size_t n = nh / heads;
    const int t = static_cast<int>(n % T);
    const float2* cs = tab + static_cast<size_t>(t) * half + i;
    const size_t o1 = n * row + static_cast<size_t>(h) * hd + i, o2 = o1 + half;
    if constexpr (P == 2) {
      float2 a, b;
      if constexpr (!LP) {
        a = *reinterpret_cast<const float2*>(qkv + o1);
        b = *reinterpret_cast<const float2*>(qkv + o2);
      } else if constexpr (std::is_same_v<S, float>) {
        a = *reinterpret_cast<const float2*>(src + o1);
        b = *reinterpret_cast<const float2*>(src + o2);
      } else {
        const ushort2 ha = *reinterpret_cast<const ushort2*>(src + o1);
        const ushort2 hb = *reinterpret_cast<const ushort2*>(src + o2);
        a = make_float2(from_half_d(dt, ha.x), from_half_d(dt, ha.y));
        b = make_float2(from_half_d(dt, hb.x), from_half_d(dt, hb.y));
      }
      float2 y1 = a, y2 = b;
      if (!LP || h < rot_heads) {
        const float4 c = *reinterpret_cast<const float4*>(cs);  // (cos, sin) of i and i + 1
        const float s0 = sign * c.y, s1 = sign * c.w;
        y1 = make_float2(a.x * c.x - b.x * s0, a.y * c.z - b.y * s1);
        y2 = make_float2(b.x * c.x + a.x * s0, b.y * c.z + a.y * s1);
      }
      if constexpr (LP) {
        *reinterpret_cast<ushort2*>(dst16 + o1) =
            make_ushort2(to_half_d(dt, y1.x), to_half_d(dt, y1.y));
        *reinterpret_cast<ushort2*>(dst16 + o2) =
            make_ushort2(to_half_d(dt, y2.x), to_half_d(dt, y2.y));
      } else {
        *reinterpret_cast<float2*>(qkv + o1) = y1;
        *reinterpret_cast<float2*>(qkv + o2) = y2;
      }
    } else {
      const float a = LP ? ldv(dt, src, o1) : qkv[o1], b = LP ? ldv(dt, src, o2) : qkv[o2];
      float y1 = a, y2 = b;
      if (!LP || h < rot_heads) {
        const float c = cs->x, sn = sign * cs->y;
        y1 = a * c - b * sn;
        y2 = b * c + a * sn;
      }
      if constexpr (LP) {
        dst16[o1] = to_half_d(dt, y1);
        dst16[o2] = to_half_d(dt, y2);
      } else {
        qkv[o1] = y1;
        qkv[o2] = y2;
      }
    }
  }
}

// ---- AdamW and utilities ------------------------------------------------------------------------

struct AdamC {
  float step_size, inv_bc2_sqrt, decay, b1, b2, omb1, omb2, eps, grad_mult;
};
__device__ __forceinline__ void adamw_f(const AdamC& c, float* p, float grad, float* m, float* v) {
  const float g = grad * c.grad_mult;
  const float mi = c.b1 * *m + c.omb1 * g;
  const float vi = c.b2 * *v + c.omb2 * g * g;
  *m = mi;
  *v = vi;
  const float denom = sqrtf(vi) * c.inv_bc2_sqrt + c.eps;
  *p = *p * c.decay - c.step_size * (mi / denom);
}

// The updated values' compute copies (Ops::adamw's copies): p16 = narrow, p32 = its widening;
// p16 null: none. gdt (0: none): the gradient read rounded to that type (round_to's values).
struct AdamOut {
  int dt;
  float* p32;
  uint16_t* p16;
  int gdt;
};

__global__ void adamw_k(float* param, const float* grad, float* m, float* v, size_t n,
                        float step_size, float inv_bc2_sqrt, float decay, float b1, float b2,
                        float omb1, float omb2, float eps, float grad_mult, AdamOut o) {
  const AdamC c{step_size, inv_bc2_sqrt, decay, b1, b2, omb1, omb2, eps, grad_mult};
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float g = o.gdt ? from_half_d(o.gdt, to_half_d(o.gdt, grad[i])) : grad[i];
    adamw_f(c, &param[i], g, &m[i], &v[i]);
    if (o.p16) {
      const uint16_t h = to_half_d(o.dt, param[i]);
      o.p16[i] = h;
      if (o.p32) o.p32[i] = from_half_d(o.dt, h);
    }
  }
}

__global__ void scale_k(float* x, float a, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    x[i] *= a;
}

// x / d, element by element, in place: fp32 (dt 0) or dt's 16-bit values widened, divided and
// rounded back (sharding/comm/reduce.cpp's divide, which the MPI groups' averages use).
__global__ void divide_k(void* x, int dt, float d, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    if (dt == 0) {
      float* p = static_cast<float*>(x);
      p[i] = p[i] / d;
    } else {
      uint16_t* p = static_cast<uint16_t*>(x);
      p[i] = to_half_d(dt, from_half_d(dt, p[i]) / d);
    }
  }
}

__global__ void fill_k(float* x, float v, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    x[i] = v;
}

__global__ void add_inplace_k(float* y, const float* x, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

// ---- Precision conversions (the bit formulas are cuda_common.cuh's f32_to_bf16_d / to_half_d).
__global__ void narrow_k(int dt, const float* src, uint16_t* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] = to_half_d(dt, src[i]);
}
// dst(rows, cols) dense = narrow(src(rows, cols; row stride ld)).
__global__ void narrow_rows_k(int dt, const float* src, size_t ld, uint16_t* dst, size_t cols,
                              size_t total) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] = to_half_d(dt, src[(i / cols) * ld + i % cols]);
}
__global__ void widen_k(int dt, const uint16_t* src, float* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] = from_half_d(dt, src[i]);
}
__global__ void add_widened_k(int dt, const uint16_t* src, float* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] += from_half_d(dt, src[i]);
}
__global__ void round_to_k(int dt, float* dst, const float* src, size_t n, uint16_t* dst16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint16_t h = to_half_d(dt, src[i]);
    if (dst16) dst16[i] = h;
    dst[i] = from_half_d(dt, h);
  }
}

__global__ void bias_rows_k(float* out, const float* b, int OC, size_t total) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = b[i % OC];
}

// ---- Fixed-order sums ---------------------------------------------------------------------------

constexpr size_t kSsChunk = size_t{1} << 16;  // elements per block of sum_squares

// Block c sums x^2 over its chunk in double: thread j takes the groups of four elements j,
// j + 256, ... (elements 4j..4j+3, then 4(j+256)..) and adds each group's squares in element
// order, then block_sum's fixed tree. A group is one float4 load where x is 16-byte aligned
// (chunks hold a multiple of four elements, so every group is then aligned) and four float
// loads otherwise, in the same order: the bits depend on n alone, never on alignment (a unit's
// gradients and the same values in a shard at an offset give the same norm). The last group
// of an n off a multiple of four is loaded one float at a time. One float per thread kept too
// few bytes in flight: 3.0 ms of the H200's Llama step for ~5 GB. dt (1 bf16, 2 f16; 0 none):
// each value read rounded to that type (round_to's values, in the same order).
template <bool VEC>
__global__ void sum_squares_chunks_k(double* part, const float* x, size_t n, int dt) {
  __shared__ double scratch[32];
  const size_t i0 = blockIdx.x * kSsChunk;
  const size_t i1 = min(n, i0 + kSsChunk);
  double s = 0;
  for (size_t i = i0 + 4 * size_t(threadIdx.x); i < i1; i += 4 * size_t(blockDim.x)) {
    if (i + 4 <= i1) {
      float4 q;
      if (VEC)
        q = ld4(x + i);
      else
        q = make_float4(x[i], x[i + 1], x[i + 2], x[i + 3]);
      if (dt) q = widen4(dt, narrow4(dt, q));
      const double a = q.x, b = q.y, c = q.z, d = q.w;
      s += a * a;
      s += b * b;
      s += c * c;
      s += d * d;
    } else {
      for (size_t t = i; t < i1; ++t) {
        const double v = dt ? from_half_d(dt, to_half_d(dt, x[t])) : x[t];
        s += v * v;
      }
    }
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// One block: *result = sum of the n doubles in a fixed order.
__global__ void sum_doubles_k(double* result, const double* part, size_t n) {
  __shared__ double scratch[32];
  double s = 0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += part[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *result = s;
}

__global__ void sum_floats_k(double* result, const float* x, int n, bool accumulate) {
  __shared__ double scratch[32];
  double s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *result = accumulate ? *result + s : s;
}

// ---- LM head rows: one block per row of logits ---------------------------------------------------

// With d16 (low-precision compute): the gradient row goes to d16 as cuda::narrow would round
// it, and the fp32 row is left as it was (one pass less over the logits). W = 4: each thread
// takes four consecutive logits per access (V a multiple of 4, rows 16-byte aligned; the H200's
// GPT-2 op times showed these passes at ~2.4 TB/s with one float per thread), so each thread
// sums its exponentials in another order than with W = 1; both orders are fixed.
template <int W>
__device__ __forceinline__ void load_w(const float* p, float (&x)[W]) {
  if constexpr (W == 4) {
    const float4 q = ld4(p);
    x[0] = q.x, x[1] = q.y, x[2] = q.z, x[3] = q.w;
  } else {
    x[0] = *p;
  }
}
template <int W>
__device__ __forceinline__ void store_w(float* row, uint16_t* row16, int v, const float (&g)[W],
                                        int dt) {
  if constexpr (W == 4) {
    if (row16)
      sth4(row16 + v, narrow4(dt, make_float4(g[0], g[1], g[2], g[3])));
    else
      st4(row + v, make_float4(g[0], g[1], g[2], g[3]));
  } else {
    if (row16)
      row16[v] = to_half_d(dt, g[0]);
    else
      row[v] = g[0];
  }
}
template <int W>
__global__ void xent_rows_k(float* logits, float* rl, const int32_t* targets, int V, bool grad,
                            float grad_scale, uint16_t* d16, int dt) {
  __shared__ float fscratch[32];
  const int r = blockIdx.x;
  float* row = logits + static_cast<size_t>(r) * V;
  uint16_t* row16 = d16 ? d16 + static_cast<size_t>(r) * V : nullptr;
  const int t = targets[r];
  const int v0 = W * threadIdx.x, step = W * blockDim.x;
  float x[W];
  if (t < 0) {  // ignored row: loss 0, no gradient (uniform branch: t is the same for the block)
    if (threadIdx.x == 0) rl[r] = 0.f;
    if (grad) {
      const float zero[W] = {};
      for (int v = v0; v < V; v += step) store_w<W>(row, row16, v, zero, dt);
    }
    return;
  }
  // One pass for the maximum and the sum of exponentials (online: each thread's running sum is
  // rescaled when its maximum grows), then each thread's sum rescaled to the row's maximum:
  // the logits are read twice where max, sum and gradient passes read them three times.
  float mx = -INFINITY, sum = 0.f;
  for (int v = v0; v < V; v += step) {
    load_w<W>(row + v, x);
    float m = x[0];
    for (int k = 1; k < W; ++k) m = fmaxf(m, x[k]);
    const float nm = fmaxf(mx, m);
    if (nm == -INFINITY) continue;  // all -inf so far: they add 0 (and -inf - -inf is NaN)
    float s = 0.f;
    for (int k = 0; k < W; ++k) s += expf(x[k] - nm);
    sum = sum * expf(mx - nm) + s;  // (mx = -inf first: expf(-inf) = 0, and sum is 0)
    mx = nm;
  }
  const float rmx = block_max(mx, fscratch);
  // (a thread without logits, v0 >= V, holds mx = -inf and sum = 0: it adds 0)
  sum = block_sum(mx == -INFINITY ? 0.f : sum * expf(mx - rmx), fscratch);  // ends with a sync
  mx = rmx;
  const float lt = row[t];
  if (threadIdx.x == 0) rl[r] = mx + logf(sum) - lt;
  if (!grad) return;
  __syncthreads();  // everyone has read row[t] before it is overwritten
  const float kk = grad_scale / sum;
  for (int v = v0; v < V; v += step) {
    load_w<W>(row + v, x);
    float g[W];
    for (int k = 0; k < W; ++k) {
      const float p = expf(x[k] - mx) * kk;
      g[k] = v + k == t ? p - grad_scale : p;
    }
    store_w<W>(row, row16, v, g, dt);
  }
}

// ---- The four-wide functors (each4): elements i..i+3 of the scalar kernel of the same name,
// each through the scalar kernel's formula (map4 / zip4 apply it per component).
template <class F>
__device__ __forceinline__ float4 map4(float4 a, F f) {
  return make_float4(f(a.x), f(a.y), f(a.z), f(a.w));
}
template <class F>
__device__ __forceinline__ float4 zip4(float4 a, float4 b, F f) {
  return make_float4(f(a.x, b.x), f(a.y, b.y), f(a.z, b.z), f(a.w, b.w));
}
// The formulas as function objects (inlined where a function pointer might not be).
struct AddF {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct GeluF {
  __device__ float operator()(float x) const { return gelu_f(x); }
};
struct GeluGradF {
  __device__ float operator()(float x, float d) const { return gelu_grad_f(x, d); }
};
struct SwigluF {
  __device__ float operator()(float g, float up) const { return swiglu_f(g, up); }
};

struct Fill4 {
  float* x;
  float v;
  __device__ void operator()(size_t i) const { st4(x + i, make_float4(v, v, v, v)); }
};
struct Scale4 {
  float* x;
  float a;
  __device__ void operator()(size_t i) const {
    const float s = a;
    st4(x + i, map4(ld4(x + i), [s](float t) { return t * s; }));
  }
};
struct Add4 {  // out = a + b (add_inplace: out = a = y; residual)
  float* out;
  const float *a, *b;
  __device__ void operator()(size_t i) const { st4(out + i, zip4(ld4(a + i), ld4(b + i), AddF{})); }
};
struct Narrow4 {  // dst(rows, cols) dense from src(rows, cols; row stride ld); ld == cols: flat
  int dt;
  const float* src;
  size_t ld, cols;
  uint16_t* dst;
  __device__ void operator()(size_t i) const {
    sth4(dst + i, narrow4(dt, ld4(src + (ld == cols ? i : (i / cols) * ld + i % cols))));
  }
};
struct Widen4 {  // dst = widen(src), or dst += widen(src)
  int dt;
  const uint16_t* src;
  float* dst;
  bool add;
  __device__ void operator()(size_t i) const {
    const float4 w = widen4(dt, ldh4(src + i));
    st4(dst + i, add ? zip4(ld4(dst + i), w, AddF{}) : w);
  }
};
struct RoundTo4 {  // dst = round(src); dst == src is in place (each index read, then written);
  int dt;          // with dst16, also dst16 = narrow(src)
  float* dst;
  const float* src;
  uint16_t* dst16;
  __device__ void operator()(size_t i) const {
    const int d = dt;
    const float4 x = ld4(src + i);
    if (dst16) {
      const ushort4 h = narrow4(d, x);
      sth4(dst16 + i, h);
      st4(dst + i, widen4(d, h));
      return;
    }
    st4(dst + i, map4(x, [d](float t) { return from_half_d(d, to_half_d(d, t)); }));
  }
};
struct Gelu4 {
  float* out;
  const float* inp;
  __device__ void operator()(size_t i) const { st4(out + i, map4(ld4(inp + i), GeluF{})); }
};
// The old values a backward adds its gradient to: dst's (accumulate), or zeros (Set: the
// written gradients, dst never read).
template <bool Set>
__device__ float4 base4(const float* dst) {
  return Set ? make_float4(0.f, 0.f, 0.f, 0.f) : ld4(dst);
}
// dinp (+)= gelu'(inp) dout; with d16, also d16 = narrow(dinp) (the result); inp and dout
// each fp32 or 16-bit (dt)
template <bool Set, class In = float, class D = float>
struct GeluBack4 {
  float* dinp;
  const In* inp;
  const D* dout;
  uint16_t* d16;
  int dt;
  __device__ void operator()(size_t i) const {
    const float4 r = zip4(base4<Set>(dinp + i),
                          zip4(ldv4(dt, inp + i), ldv4(dt, dout + i), GeluGradF{}), AddF{});
    if (dinp) st4(dinp + i, r);
    if (d16) sth4(d16 + i, narrow4(dt, r));
  }
};
template <class In>
struct GeluLp4 {  // out16 = narrow(gelu(inp)), inp fp32 or 16-bit (dt)
  int dt;
  uint16_t* out;
  const In* inp;
  __device__ void operator()(size_t i) const {
    sth4(out + i, narrow4(dt, map4(ldv4(dt, inp + i), GeluF{})));
  }
};
// Row n of gu is (gate F, up F); F a multiple of 4, so four columns stay in one row.
struct Swiglu4 {
  float* out;
  const float* gu;
  size_t F;
  __device__ void operator()(size_t i) const {
    const size_t n = i / F, f = i % F;
    st4(out + i, zip4(ld4(gu + n * 2 * F + f), ld4(gu + n * 2 * F + F + f), SwigluF{}));
  }
};
template <class In>
struct SwigluLp4 {  // out16 = narrow(swiglu(gu)), gu fp32 or 16-bit (dt)
  int dt;
  uint16_t* out;
  const In* gu;
  size_t F;
  __device__ void operator()(size_t i) const {
    const size_t n = i / F, f = i % F;
    sth4(out + i, narrow4(dt, zip4(ldv4(dt, gu + n * 2 * F + f), ldv4(dt, gu + n * 2 * F + F + f),
                                   SwigluF{})));
  }
};
// SwiGLU's gradients of four consecutive (row, column) values from i on: the gate's (dg, at
// dgu + ig) and the up's (du, at dgu + iu), the arithmetic both four-wide forms share.
template <class In, class D>  // gu and dout each fp32, or 16-bit (dt)
__device__ __forceinline__ void swiglu_grad4(int dt, const D* dout, const In* gu, size_t i,
                                             size_t F, size_t& ig, size_t& iu, float4& dg,
                                             float4& du) {
  const size_t n = i / F, f = i % F;
  ig = n * 2 * F + f, iu = ig + F;
  const float4 g = ldv4(dt, gu + ig), u = ldv4(dt, gu + iu), d = ldv4(dt, dout + i);
  swiglu_grad_f(g.x, u.x, d.x, &dg.x, &du.x);
  swiglu_grad_f(g.y, u.y, d.y, &dg.y, &du.y);
  swiglu_grad_f(g.z, u.z, d.z, &dg.z, &du.z);
  swiglu_grad_f(g.w, u.w, d.w, &dg.w, &du.w);
}
template <bool Set>
struct SwigluBack4 {
  float* dgu;
  const float *dout, *gu;
  size_t F;
  __device__ void operator()(size_t i) const {
    size_t ig, iu;
    float4 dg, du;
    swiglu_grad4(0, dout, gu, i, F, ig, iu, dg, du);
    st4(dgu + iu, zip4(base4<Set>(dgu + iu), du, AddF{}));
    st4(dgu + ig, zip4(base4<Set>(dgu + ig), dg, AddF{}));
  }
};
template <class In, class D>
struct SwigluBackLp4 {  // dgu16 = narrow(SwigluBack4<true>'s values), gu, dout fp32 or 16-bit
  int dt;
  uint16_t* dgu;
  const D* dout;
  const In* gu;
  size_t F;
  __device__ void operator()(size_t i) const {
    size_t ig, iu;
    float4 dg, du;
    swiglu_grad4(dt, dout, gu, i, F, ig, iu, dg, du);
    sth4(dgu + iu, narrow4(dt, zip4(base4<true>(nullptr), du, AddF{})));
    sth4(dgu + ig, narrow4(dt, zip4(base4<true>(nullptr), dg, AddF{})));
  }
};
struct Adamw4 {
  AdamC c;
  float *param, *m, *v;
  const float* grad;
  AdamOut o;
  __device__ void operator()(size_t i) const {
    float4 p = ld4(param + i), mm = ld4(m + i), vv = ld4(v + i);
    float4 g = ld4(grad + i);
    if (o.gdt) g = widen4(o.gdt, narrow4(o.gdt, g));
    adamw_f(c, &p.x, g.x, &mm.x, &vv.x);
    adamw_f(c, &p.y, g.y, &mm.y, &vv.y);
    adamw_f(c, &p.z, g.z, &mm.z, &vv.z);
    adamw_f(c, &p.w, g.w, &mm.w, &vv.w);
    st4(param + i, p);
    st4(m + i, mm);
    st4(v + i, vv);
    if (o.p16) {
      const ushort4 h = narrow4(o.dt, p);
      sth4(o.p16 + i, h);
      if (o.p32) st4(o.p32 + i, widen4(o.dt, h));
    }
  }
};

// The embedding lookup's launch, the table fp32 or 16-bit (table_value).
template <class Tab>
void embedding_forward_t(cudaStream_t s, float* out, const int32_t* tokens, const Tab* wte,
                         int dt, const float* wpe, int B, int T, int C) {
  const size_t total = static_cast<size_t>(B) * T * C;
  if (total == 0) return;
  embedding_forward_k<Tab><<<grid_for(total, kThreads), kThreads, 0, s>>>(out, tokens, wte, dt,
                                                                          wpe, T, C, total);
  SW_CUDA_LAUNCHED();
}

}  // namespace

// ---- Launchers ----------------------------------------------------------------------------------

void embedding_forward(cudaStream_t s, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int B, int T, int C) {
  embedding_forward_t(s, out, tokens, wte, 0, wpe, B, T, C);
}

void embedding_forward16(cudaStream_t s, int dt, float* out, const int32_t* tokens,
                         const uint16_t* wte16, const float* wpe, int B, int T, int C) {
  embedding_forward_t(s, out, tokens, wte16, dt, wpe, B, T, C);
}

void embedding_backward(cudaStream_t s, float* dwte, float* dwpe, const float* dout,
                        const int32_t* tokens, int B, int T, int C) {
  const int BT = B * T;
  if (BT == 0 || C == 0) return;
  if (dwte) {
    const dim3 grid((C + kThreads - 1) / kThreads, kBuckets);
    embedding_backward_wte_k<<<grid, kThreads, 0, s>>>(dwte, dout, tokens, BT, C);
    SW_CUDA_LAUNCHED();
  }
  if (dwpe) {
    const size_t total = static_cast<size_t>(T) * C;
    embedding_backward_wpe_k<<<grid_for(total, kThreads), kThreads, 0, s>>>(dwpe, dout, B, T, C);
    SW_CUDA_LAUNCHED();
  }
}

void gelu_forward(cudaStream_t s, float* out, const float* inp, size_t n) {
  const size_t v = al16(out) && al16(inp) ? n / 4 * 4 : 0;
  each4(s, v / 4, Gelu4{out, inp});
  out += v, inp += v, n -= v;
  if (n == 0) return;
  gelu_forward_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, inp, n);
  SW_CUDA_LAUNCHED();
}

template <class In>
void gelu_forward_lp_t(cudaStream_t s, int dt, uint16_t* out16, const In* inp, size_t n) {
  const size_t v = al8(out16) && al_in(inp) ? n / 4 * 4 : 0;
  each4(s, v / 4, GeluLp4<In>{dt, out16, inp});
  out16 += v, inp += v, n -= v;
  if (n == 0) return;
  gelu_forward_lp_k<In><<<grid_for(n, kThreads), kThreads, 0, s>>>(dt, out16, inp, n);
  SW_CUDA_LAUNCHED();
}
void gelu_forward_lp(cudaStream_t s, int dt, uint16_t* out16, const float* inp, size_t n) {
  gelu_forward_lp_t(s, dt, out16, inp, n);
}
void gelu_forward_lp(cudaStream_t s, int dt, uint16_t* out16, const uint16_t* inp, size_t n) {
  gelu_forward_lp_t(s, dt, out16, inp, n);
}

template <bool Set, class In = float, class D = float>
void gelu_backward_t(cudaStream_t s, float* dinp, const In* inp, const D* dout, size_t n,
                     uint16_t* d16, int dt) {
  const size_t v =
      al16(dinp) && al_in(inp) && al_in(dout) && (!d16 || al8(d16)) ? n / 4 * 4 : 0;
  each4(s, v / 4, GeluBack4<Set, In, D>{dinp, inp, dout, d16, dt});
  inp += v, dout += v, n -= v;
  if (dinp) dinp += v;  // (null with Set: the 16-bit form alone)
  if (d16) d16 += v;
  if (n == 0) return;
  gelu_backward_k<Set, In, D><<<grid_for(n, kThreads), kThreads, 0, s>>>(dinp, inp, dout, n,
                                                                          d16, dt);
  SW_CUDA_LAUNCHED();
}
// Calls f with whichever of an input's two forms is given: the fp32 pointer, else the 16-bit one.
template <class F>
void with_form(const float* f32, const uint16_t* h, F&& f) {
  if (f32)
    f(f32);
  else
    f(h);
}

void gelu_backward_set(cudaStream_t s, int dt, float* dinp, const float* inp,
                       const uint16_t* inp16, const float* dout, const uint16_t* dout16,
                       size_t n, uint16_t* d16) {
  with_form(inp, inp16, [&](auto x) {
    with_form(dout, dout16, [&](auto d) { gelu_backward_t<true>(s, dinp, x, d, n, d16, dt); });
  });
}

void gelu_backward(cudaStream_t s, float* dinp, const float* inp, const float* dout, size_t n,
                   bool set, uint16_t* d16, int dt) {
  if (set)
    gelu_backward_t<true>(s, dinp, inp, dout, n, d16, dt);
  else
    gelu_backward_t<false>(s, dinp, inp, dout, n, d16, dt);
}

void swiglu_forward(cudaStream_t s, float* out, const float* gu, int N, int F) {
  const size_t total = static_cast<size_t>(N) * F;
  if (total == 0) return;
  if (F % 4 == 0 && al16(out) && al16(gu)) return each4(s, total / 4, Swiglu4{out, gu, size_t(F)});
  swiglu_forward_k<<<grid_for(total, kThreads), kThreads, 0, s>>>(out, gu, F, total);
  SW_CUDA_LAUNCHED();
}

template <class In>
void swiglu_forward_lp_t(cudaStream_t s, int dt, uint16_t* out16, const In* gu, int N, int F) {
  const size_t total = static_cast<size_t>(N) * F;
  if (total == 0) return;
  if (F % 4 == 0 && al8(out16) && al_in(gu))
    return each4(s, total / 4, SwigluLp4<In>{dt, out16, gu, size_t(F)});
  swiglu_forward_lp_k<In><<<grid_for(total, kThreads), kThreads, 0, s>>>(dt, out16, gu, F, total);
  SW_CUDA_LAUNCHED();
}
void swiglu_forward_lp(cudaStream_t s, int dt, uint16_t* out16, const float* gu, int N, int F) {
  swiglu_forward_lp_t(s, dt, out16, gu, N, F);
}
void swiglu_forward_lp(cudaStream_t s, int dt, uint16_t* out16, const uint16_t* gu, int N, int F) {
  swiglu_forward_lp_t(s, dt, out16, gu, N, F);
}

template <bool Set>
void swiglu_backward_t(cudaStream_t s, float* dgu, const float* dout, const float* gu, int N,
                       int F) {
  const size_t total = static_cast<size_t>(N) * F;
  if (total == 0) return;
  if (F % 4 == 0 && al16(dgu) && al16(dout) && al16(gu))
    return each4(s, total / 4, SwigluBack4<Set>{dgu, dout, gu, size_t(F)});
  swiglu_backward_k<Set><<<grid_for(total, kThreads), kThreads, 0, s>>>(dgu, dout, gu, F, total);
  SW_CUDA_LAUNCHED();
}

void swiglu_backward(cudaStream_t s, float* dgu, const float* dout, const float* gu, int N,
                     int F, bool set) {
  if (set)
    swiglu_backward_t<true>(s, dgu, dout, gu, N, F);
  else
    swiglu_backward_t<false>(s, dgu, dout, gu, N, F);
}

template <class In, class D>
void swiglu_backward_lp_t(cudaStream_t s, int dt, uint16_t* dgu16, const D* dout,
                          const In* gu, int N, int F) {
  const size_t total = static_cast<size_t>(N) * F;
  if (total == 0) return;
  if (F % 4 == 0 && al8(dgu16) && al_in(dout) && al_in(gu))
    return each4(s, total / 4, SwigluBackLp4<In, D>{dt, dgu16, dout, gu, size_t(F)});
  swiglu_backward_lp_k<In, D><<<grid_for(total, kThreads), kThreads, 0, s>>>(dt, dgu16, dout,
                                                                             gu, F, total);
  SW_CUDA_LAUNCHED();
}
void swiglu_backward_lp_set(cudaStream_t s, int dt, uint16_t* dgu16, const float* dout,
                            const uint16_t* dout16, const float* gu, const uint16_t* gu16, int N,
                            int F) {
  with_form(gu, gu16, [&](auto g) {
    with_form(dout, dout16, [&](auto d) { swiglu_backward_lp_t(s, dt, dgu16, d, g, N, F); });
  });
}

void residual_forward(cudaStream_t s, float* out, const float* a, const float* b, size_t n) {
  const size_t v = al16(out) && al16(a) && al16(b) ? n / 4 * 4 : 0;
  each4(s, v / 4, Add4{out, a, b});
  out += v, a += v, b += v, n -= v;
  if (n == 0) return;
  residual_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, a, b, n);
  SW_CUDA_LAUNCHED();
}

void rope_table(cudaStream_t s, float* tab, int T, int hd, const RopeSpec& rope) {
  const size_t total = static_cast<size_t>(T) * (hd / 2);
  if (total == 0) return;
  rope_table_k<<<grid_for(total, kThreads), kThreads, 0, s>>>(reinterpret_cast<float2*>(tab), T,
                                                              hd, rope);
  SW_CUDA_LAUNCHED();
}

void rope_apply(cudaStream_t s, float* qkv, const float* tab, int B, int T, int H, int KVH,
                int hd, float sign) {
  const int rot_heads = H + KVH, half = hd / 2;
  const size_t pairs = static_cast<size_t>(B) * T * rot_heads * half;
  if (pairs == 0) return;
  const size_t row = static_cast<size_t>(H + 2 * KVH) * hd;
  const float2* t2 = reinterpret_cast<const float2*>(tab);
  // Two pairs per thread where their floats are 8-byte aligned (half even: every offset is).
  if (half % 2 == 0 && al8(qkv) && al16(tab)) {
    rope_k<2, false, float><<<grid_for(pairs / 2, kThreads), kThreads, 0, s>>>(
        qkv, nullptr, nullptr, 0, t2, T, rot_heads, rot_heads, hd, row, sign, pairs / 2);
  } else {
    rope_k<1, false, float><<<grid_for(pairs, kThreads), kThreads, 0, s>>>(
        qkv, nullptr, nullptr, 0, t2, T, rot_heads, rot_heads, hd, row, sign, pairs);
  }
  SW_CUDA_LAUNCHED();
}

template <class S>
void rope_apply_lp_t(cudaStream_t s, int dt, uint16_t* dst16, const S* src, const float* tab,
                     int B, int T, int H, int KVH, int hd, float sign) {
  const int heads = H + 2 * KVH, half = hd / 2;
  const size_t pairs = static_cast<size_t>(B) * T * heads * half;
  if (pairs == 0) return;
  const size_t row = static_cast<size_t>(heads) * hd;
  const float2* t2 = reinterpret_cast<const float2*>(tab);
  // Two pairs per thread where src's values are 8-byte (fp32) or 4-byte (16-bit) and dst16's
  // values 4-byte aligned.
  const bool src_al = std::is_same_v<S, float> ? al8(src) : al4(src);
  if (half % 2 == 0 && src_al && al16(tab) && al4(dst16)) {
    rope_k<2, true, S><<<grid_for(pairs / 2, kThreads), kThreads, 0, s>>>(
        nullptr, src, dst16, dt, t2, T, heads, H + KVH, hd, row, sign, pairs / 2);
  } else {
    rope_k<1, true, S><<<grid_for(pairs, kThreads), kThreads, 0, s>>>(
        nullptr, src, dst16, dt, t2, T, heads, H + KVH, hd, row, sign, pairs);
  }
  SW_CUDA_LAUNCHED();
}
void rope_apply_lp(cudaStream_t s, int dt, uint16_t* dst16, const float* src, const float* tab,
                   int B, int T, int H, int KVH, int hd, float sign) {
  rope_apply_lp_t(s, dt, dst16, src, tab, B, T, H, KVH, hd, sign);
}
void rope_apply_lp(cudaStream_t s, int dt, uint16_t* dst16, const uint16_t* src,
                   const float* tab, int B, int T, int H, int KVH, int hd, float sign) {
  rope_apply_lp_t(s, dt, dst16, src, tab, B, T, H, KVH, hd, sign);
}

void adamw(cudaStream_t s, float* param, const float* grad, float* m, float* v, size_t n,
           float lr, float beta1, float beta2, float eps, float wd, int step, float grad_mult,
           int dt, float* p32, uint16_t* p16, int gdt) {
  if (n == 0) return;
  // Scalar coefficients in double, rounded once (as kernels/cpu/adamw.cpp).
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), step);
  const float step_size = static_cast<float>(static_cast<double>(lr) / bc1);
  const float inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * wd);
  const float omb1 = static_cast<float>(1.0 - beta1), omb2 = static_cast<float>(1.0 - beta2);
  AdamOut o{dt, p16 ? p32 : nullptr, p16, gdt};
  const size_t vn = al16(param) && al16(grad) && al16(m) && al16(v) &&
                            (!o.p16 || al8(o.p16)) && (!o.p32 || al16(o.p32))
                        ? n / 4 * 4
                        : 0;
  each4(s, vn / 4,
        Adamw4{AdamC{step_size, inv_bc2_sqrt, decay, beta1, beta2, omb1, omb2, eps, grad_mult},
               param, m, v, grad, o});
  param += vn, grad += vn, m += vn, v += vn, n -= vn;
  if (o.p16) o.p16 += vn;
  if (o.p32) o.p32 += vn;
  if (n == 0) return;
  adamw_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(param, grad, m, v, n, step_size,
                                                     inv_bc2_sqrt, decay, beta1, beta2, omb1,
                                                     omb2, eps, grad_mult, o);
  SW_CUDA_LAUNCHED();
}

void scale(cudaStream_t s, float* x, float a, size_t n) {
  const size_t v = al16(x) ? n / 4 * 4 : 0;
  each4(s, v / 4, Scale4{x, a});
  x += v, n -= v;
  if (n == 0) return;
  scale_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(x, a, n);
  SW_CUDA_LAUNCHED();
}

void divide(cudaStream_t s, int dt, void* x, float d, size_t n) {
  if (n == 0) return;
  divide_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(x, dt, d, n);
  SW_CUDA_LAUNCHED();
}

void fill(cudaStream_t s, float* x, float v, size_t n) {
  const size_t k = al16(x) ? n / 4 * 4 : 0;
  each4(s, k / 4, Fill4{x, v});
  x += k, n -= k;
  if (n == 0) return;
  fill_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(x, v, n);
  SW_CUDA_LAUNCHED();
}

void add_inplace(cudaStream_t s, float* y, const float* x, size_t n) {
  const size_t v = al16(y) && al16(x) ? n / 4 * 4 : 0;
  each4(s, v / 4, Add4{y, y, x});
  y += v, x += v, n -= v;
  if (n == 0) return;
  add_inplace_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(y, x, n);
  SW_CUDA_LAUNCHED();
}

void narrow(cudaStream_t s, int dt, const float* src, uint16_t* dst, size_t n) {
  const size_t v = al16(src) && al8(dst) ? n / 4 * 4 : 0;
  each4(s, v / 4, Narrow4{dt, src, 1, 1, dst});  // ld == cols: flat
  src += v, dst += v, n -= v;
  if (n == 0) return;
  narrow_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(dt, src, dst, n);
  SW_CUDA_LAUNCHED();
}
void narrow_rows(cudaStream_t s, int dt, const float* src, size_t ld, size_t rows, size_t cols,
                 uint16_t* dst) {
  if (ld == cols) return narrow(s, dt, src, dst, rows * cols);
  const size_t total = rows * cols;
  if (total == 0) return;
  if (cols % 4 == 0 && ld % 4 == 0 && al16(src) && al8(dst))
    return each4(s, total / 4, Narrow4{dt, src, ld, cols, dst});
  narrow_rows_k<<<grid_for(total, kThreads), kThreads, 0, s>>>(dt, src, ld, dst, cols, total);
  SW_CUDA_LAUNCHED();
}
void widen(cudaStream_t s, int dt, const uint16_t* src, float* dst, size_t n) {
  const size_t v = al8(src) && al16(dst) ? n / 4 * 4 : 0;
  each4(s, v / 4, Widen4{dt, src, dst, false});
  src += v, dst += v, n -= v;
  if (n == 0) return;
  widen_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(dt, src, dst, n);
  SW_CUDA_LAUNCHED();
}
void add_widened(cudaStream_t s, int dt, const uint16_t* src, float* dst, size_t n) {
  const size_t v = al8(src) && al16(dst) ? n / 4 * 4 : 0;
  each4(s, v / 4, Widen4{dt, src, dst, true});
  src += v, dst += v, n -= v;
  if (n == 0) return;
  add_widened_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(dt, src, dst, n);
  SW_CUDA_LAUNCHED();
}
void round_copy(cudaStream_t s, int dt, float* dst, const float* src, size_t n, uint16_t* dst16) {
  const size_t v = al16(dst) && al16(src) && (!dst16 || al8(dst16)) ? n / 4 * 4 : 0;
  each4(s, v / 4, RoundTo4{dt, dst, src, dst16});
  dst += v, src += v, n -= v;
  if (dst16) dst16 += v;
  if (n == 0) return;
  round_to_k<<<grid_for(n, kThreads), kThreads, 0, s>>>(dt, dst, src, n, dst16);
  SW_CUDA_LAUNCHED();
}
void round_to(cudaStream_t s, int dt, float* x, size_t n) { round_copy(s, dt, x, x, n); }

void add_bias_rows(cudaStream_t s, float* out, const float* b, int N, int OC) {
  const size_t total = static_cast<size_t>(N) * OC;
  if (total == 0) return;
  bias_rows_k<<<grid_for(total, kThreads), kThreads, 0, s>>>(out, b, OC, total);
  SW_CUDA_LAUNCHED();
}

size_t sum_squares_ws(size_t n) { return (n + kSsChunk - 1) / kSsChunk; }

void sum_squares(cudaStream_t s, double* result, const float* x, size_t n, double* ws, int dt) {
  const size_t nchunks = sum_squares_ws(n);
  if (nchunks == 0) {
    SW_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(double), s));
    return;
  }
  SW_CUDA_CHECK(nchunks <= 0x7fffffffu ? cudaSuccess : cudaErrorInvalidValue);
  if (al16(x))
    sum_squares_chunks_k<true><<<static_cast<unsigned>(nchunks), kThreads, 0, s>>>(ws, x, n, dt);
  else
    sum_squares_chunks_k<false><<<static_cast<unsigned>(nchunks), kThreads, 0, s>>>(ws, x, n, dt);
  SW_CUDA_LAUNCHED();
  sum_doubles_k<<<1, 1024, 0, s>>>(result, ws, nchunks);
  SW_CUDA_LAUNCHED();
}

void sum_rows(cudaStream_t s, double* result, const float* x, int n, bool accumulate) {
  sum_floats_k<<<1, 1024, 0, s>>>(result, x, n, accumulate);
  SW_CUDA_LAUNCHED();
}

void xent_rows(cudaStream_t s, float* logits, float* rl, const int32_t* targets, int nc, int V,
               bool grad, float grad_scale, uint16_t* d16, int dt) {
  if (nc == 0) return;
  if (V % 4 == 0 && al16(logits) && (!d16 || al8(d16)))
    xent_rows_k<4><<<nc, 512, 0, s>>>(logits, rl, targets, V, grad, grad_scale, d16, dt);
  else
    xent_rows_k<1><<<nc, 512, 0, s>>>(logits, rl, targets, V, grad, grad_scale, d16, dt);
  SW_CUDA_LAUNCHED();
}

}  // namespace sw::cuda
