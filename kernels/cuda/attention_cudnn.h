// cuDNN's fused attention for the CUDA Ops' bf16 / fp16 compute (SHARDWISE_CUDA_ATTENTION=cudnn;
// attention_path.h): cuDNN's scaled-dot-product-attention graphs, built through cuDNN's
// frontend (a header-only library; scripts/cudnn_frontend.sh fetches it) once per shape and
// cached. Causal, grouped-query heads, scale 1/sqrt(hd), fp32 softmax statistics; the backward
// asks cuDNN for its deterministic algorithm, so a rerun gives the same bits.
//
// The buffers are 16-bit (dt: DType::BF16 or F16), narrowed by the caller from the Ops' fp32:
//   qkv16  (B, T, (H + 2 KVH) hd), packed as the Ops' qkv ([q heads | k heads | v heads]);
//   o16, do16  (B, T, H hd), as the Ops' out / dout;
//   dqkv16  like qkv16, written whole (not accumulated: the caller adds it into dqkv);
//   lse  fp32 (B, H, T): the natural-log log-sum-exp of each row's scaled scores, the meaning
//        every attention path gives it.
// Plain C++ (no CUDA or cuDNN header): cudaStream_t travels as void*.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace sw::cuda {

struct AttnShape {
  DType dt;
  int B, T, H, KVH, hd;
};

// Whether this build has the path (cuDNN and its frontend were found at configure time).
bool cudnn_attention_built();

// Builds (once per shape and direction, then cached) the forward or backward graph on the
// current device. Returns the workspace bytes its execution needs, or -1 when cuDNN does not
// take the shape (head dim not a multiple of 8, no engine for it, no cuDNN in this build...);
// `why` then holds cuDNN's reason. *first (may be null): whether this call built the entry
// (so a caller can say a refusal once). Never throws for a refused shape.
int64_t cudnn_attention_prepare(const AttnShape& s, bool backward, std::string* why,
                                bool* first = nullptr);

// Enqueued on `stream` (no host synchronisation); prepare must have returned >= 0 for the
// shape and direction; `ws` holds at least that many bytes (null when 0).
void cudnn_attention_forward(void* stream, const AttnShape& s, const uint16_t* qkv16,
                             uint16_t* o16, float* lse, void* ws);
void cudnn_attention_backward(void* stream, const AttnShape& s, const uint16_t* qkv16,
                              const uint16_t* o16, const uint16_t* do16, const float* lse,
                              uint16_t* dqkv16, void* ws);

// Executions so far (forward and backward), for tests that must know the path ran.
long long cudnn_attention_runs();

// Checking the graphs where there is no GPU. cudnn_device_properties: this process's GPU as
// cuDNN describes it (its JSON; cuDNN >= 9.8), to be kept in tests/data/cudnn_devices/;
// throws naming the reason. cudnn_attention_check_offline: whether cuDNN would build the
// shape's graph for the device `props` describes, with no GPU (cuDNN's ahead-of-time path:
// validate, heuristic plan, support, build); "" when it would (then *workspace, if given, is
// its workspace bytes), else the step that failed and cuDNN's reason.
// Without a CUDA driver cuDNN can validate and lower a graph and its heuristics can offer
// engines for it, but it cannot finalise an engine it compiles at run time (NVRTC, then the
// driver loads it): cudnn_only_driver_missing(why) tells that case (the reason names offered
// engine configs that failed only for want of the driver) from a real refusal.
std::string cudnn_device_properties();
std::string cudnn_attention_check_offline(const std::string& props, const AttnShape& s,
                                          bool backward, int64_t* workspace = nullptr);
bool cudnn_only_driver_missing(const std::string& why);

}  // namespace sw::cuda
