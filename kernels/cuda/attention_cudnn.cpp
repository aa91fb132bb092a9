// cuDNN's fused attention through its frontend's graph API (attention_cudnn.h). Compiled by the
// host compiler; with SW_HAVE_CUDNN_SDPA (CMake found cuDNN and cudnn_frontend.h) it builds the
// graphs, otherwise every shape is refused with the reason.
//
// The Ops' packed layouts are strided views for cuDNN's (batch, head, sequence, head dim)
// tensors, so nothing is repacked: with R = (H + 2 KVH) hd, Q is qkv16 with strides
// (T R, hd, R, 1) over (B, H, T, hd), K and V the same strides from columns H hd and
// (H + KVH) hd over (B, KVH, T, hd); O and dO (T H hd, hd, H hd, 1); the statistics (H T, T, 1, 1)
// over (B, H, T, 1) are the Ops' lse; dQ, dK, dV land in dqkv16 as Q, K, V lie in qkv16.
#include "kernels/cuda/attention_cudnn.h"

#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/error.h"

#if SW_HAVE_CUDNN_SDPA
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include "kernels/cuda/lazy_load.h"
#endif

namespace sw::cuda {

namespace {
std::atomic<long long> g_runs{0};
}  // namespace

long long cudnn_attention_runs() { return g_runs.load(); }

#if SW_HAVE_CUDNN_SDPA

namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;  // null: refused
  int64_t workspace = 0;
  std::string why;
};

using Key = std::tuple<int, int, int, int, int, int, bool>;  // dt, B, T, H, KVH, hd, backward

std::mutex g_mu;

// One handle for the process's one device (the caller made it current), never destroyed (as
// the CUDA Ops' stream and cuBLAS handle).
cudnnHandle_t handle() {
  static cudnnHandle_t h = [] {
    cudnnHandle_t x = nullptr;
    const cudnnStatus_t st = cudnnCreate(&x);
    if (st != CUDNN_STATUS_SUCCESS)
      fail("cuda", std::string("cudnnCreate failed: ") + cudnnGetErrorString(st));
    return x;
  }();
  return h;
}

// Why the shape cannot be a graph at all ("" when it can).
std::string shape_refusal(const AttnShape& s) {
  if (s.dt != DType::BF16 && s.dt != DType::F16)
    return "cuDNN attention takes bf16 or fp16 compute only";
  if (s.hd % 8 != 0)  // 16-byte rows and aligned K / V views
    return "head dim " + std::to_string(s.hd) + " is not a multiple of 8";
  return "";
}

// The forward or backward graph of the shape, defined (not built); sm > 0: for that SM
// version, which the nodes then take instead of asking the CUDA runtime (set before they are
// made: each copies the graph's context).
std::shared_ptr<fe::graph::Graph> define(const AttnShape& s, bool backward, int sm = 0) {
  const int64_t B = s.B, T = s.T, H = s.H, KVH = s.KVH, hd = s.hd, R = (H + 2 * KVH) * hd;
  auto g = std::make_shared<fe::graph::Graph>();
  if (sm > 0) g->set_sm_version(sm);
  g->set_io_data_type(s.dt == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto packed = [&](const char* name, int64_t uid, int64_t heads) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({B, heads, T, hd})
                         .set_stride({T * R, hd, R, 1}));
  };
  const std::vector<int64_t> o_dim{B, H, T, hd}, o_stride{T * H * hd, hd, H * hd, 1};
  const std::vector<int64_t> st_dim{B, H, T, 1}, st_stride{H * T, T, 1, 1};
  auto Q = packed("Q", kQ, H), K = packed("K", kK, KVH), V = packed("V", kV, KVH);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  if (!backward) {
    auto opt = fe::graph::SDPA_attributes()
                   .set_name("sw_attention")
                   .set_generate_stats(true)
                   .set_causal_mask(true)
                   .set_attn_scale(scale);
    auto [O, Stats] = g->sdpa(Q, K, V, opt);
    O->set_output(true).set_uid(kO).set_dim(o_dim).set_stride(o_stride);
    Stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(st_dim)
        .set_stride(st_stride);
  } else {
    auto O = g->tensor(fe::graph::Tensor_attributes().set_name("O").set_uid(kO).set_dim(o_dim).set_stride(o_stride));
    auto dO = g->tensor(fe::graph::Tensor_attributes().set_name("dO").set_uid(kdO).set_dim(o_dim).set_stride(o_stride));
    auto Stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("Stats")
                               .set_uid(kStats)
                               .set_dim(st_dim)
                               .set_stride(st_stride)
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opt = fe::graph::SDPA_backward_attributes()
                   .set_name("sw_attention_backward")
                   .set_causal_mask(true)
                   .set_attn_scale(scale)
                   .set_deterministic_algorithm(true);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opt);
    dQ->set_output(true).set_uid(kdQ).set_dim({B, H, T, hd}).set_stride({T * R, hd, R, 1});
    dK->set_output(true).set_uid(kdK).set_dim({B, KVH, T, hd}).set_stride({T * R, hd, R, 1});
    dV->set_output(true).set_uid(kdV).set_dim({B, KVH, T, hd}).set_stride({T * R, hd, R, 1});
  }
  return g;
}

// Validates the graph, picks cuDNN's heuristic plan and builds it: for this process's GPU
// (handle), or, without one, for the device g's properties describe (handle null: cuDNN's
// ahead-of-time path). Returns "" or the step that failed with cuDNN's reason.
std::string finish(fe::graph::Graph& g, cudnnHandle_t h, int64_t* workspace) {
  // cuDNN's engines compiled at run time open libnvrtc, which no executable links (lazy_load.h).
  const std::string nvrtc_missing = nvrtc_preload();
  auto refused = [&](const char* step, fe::error_t e) {
    return std::string(step) + ": " + e.get_message() +
           (nvrtc_missing.empty() ? "" : " (NVRTC, for cuDNN's run-time compiled engines: " +
                                             nvrtc_missing + ")");
  };
  fe::error_t e = g.validate();
  if (!e.is_good()) return refused("validate", e);
  e = h ? g.build_operation_graph(h) : g.build_operation_graph();
  if (!e.is_good()) return refused("build_operation_graph", e);
  e = g.create_execution_plans({fe::HeurMode_t::A});
  if (!e.is_good()) return refused("create_execution_plans", e);
  e = g.check_support();
  if (!e.is_good()) return refused("check_support", e);
  e = g.build_plans();
  if (!e.is_good()) return refused("build_plans", e);
  e = g.get_workspace_size(*workspace);
  if (!e.is_good()) return refused("get_workspace_size", e);
  return "";
}

Built build(const AttnShape& s, bool backward) {
  Built out;
  out.why = shape_refusal(s);
  if (!out.why.empty()) return out;
  auto g = define(s, backward);
  out.why = finish(*g, handle(), &out.workspace);
  if (out.why.empty()) out.graph = std::move(g);
  return out;
}

// first (may be null): set to whether this call built the entry.
const Built& built(const AttnShape& s, bool backward, bool* first = nullptr) {
  static std::map<Key, Built>* cache = new std::map<Key, Built>();
  const Key k{static_cast<int>(s.dt), s.B, s.T, s.H, s.KVH, s.hd, backward};
  auto it = cache->find(k);
  if (first) *first = it == cache->end();
  if (it == cache->end()) {
    Built b;
    try {
      b = build(s, backward);
    } catch (const std::exception& ex) {  // the frontend reports by status; this is a backstop
      b = Built{};
      b.why = ex.what();
    }
    it = cache->emplace(k, std::move(b)).first;
  }
  return it->second;
}

void run(void* stream, const AttnShape& s, bool backward,
         std::unordered_map<int64_t, void*>& pack, void* ws) {
  std::lock_guard<std::mutex> lk(g_mu);
  const Built& b = built(s, backward);
  SW_CHECK(b.graph, "cuDNN attention: shape not prepared or refused: " + b.why);
  const cudnnStatus_t st = cudnnSetStream(handle(), static_cast<cudaStream_t>(stream));
  if (st != CUDNN_STATUS_SUCCESS)
    fail("cuda", std::string("cudnnSetStream failed: ") + cudnnGetErrorString(st));
  fe::error_t e = b.graph->execute(handle(), pack, ws);
  if (!e.is_good())
    fail("cuda", std::string("cuDNN attention ") + (backward ? "backward" : "forward") +
                     " failed (B " + std::to_string(s.B) + ", T " + std::to_string(s.T) +
                     ", H " + std::to_string(s.H) + ", KVH " + std::to_string(s.KVH) +
                     ", hd " + std::to_string(s.hd) + "): " + e.get_message());
  ++g_runs;
}

void* mut(const void* p) { return const_cast<void*>(p); }

}  // namespace

bool cudnn_attention_built() { return true; }

int64_t cudnn_attention_prepare(const AttnShape& s, bool backward, std::string* why,
                                bool* first) {
  std::lock_guard<std::mutex> lk(g_mu);
  const Built& b = built(s, backward, first);
  if (!b.graph) {
    if (why) *why = b.why;
    return -1;
  }
  return b.workspace;
}

void cudnn_attention_forward(void* stream, const AttnShape& s, const uint16_t* qkv16,
                             uint16_t* o16, float* lse, void* ws) {
  const size_t hq = size_t(s.H) * s.hd, hk = size_t(s.KVH) * s.hd;
  std::unordered_map<int64_t, void*> pack{{kQ, mut(qkv16)},
                                          {kK, mut(qkv16 + hq)},
                                          {kV, mut(qkv16 + hq + hk)},
                                          {kO, o16},
                                          {kStats, lse}};
  run(stream, s, false, pack, ws);
}

void cudnn_attention_backward(void* stream, const AttnShape& s, const uint16_t* qkv16,
                              const uint16_t* o16, const uint16_t* do16, const float* lse,
                              uint16_t* dqkv16, void* ws) {
  const size_t hq = size_t(s.H) * s.hd, hk = size_t(s.KVH) * s.hd;
  std::unordered_map<int64_t, void*> pack{
      {kQ, mut(qkv16)},       {kK, mut(qkv16 + hq)},  {kV, mut(qkv16 + hq + hk)},
      {kO, mut(o16)},         {kdO, mut(do16)},       {kStats, mut(lse)},
      {kdQ, dqkv16},          {kdK, dqkv16 + hq},     {kdV, dqkv16 + hq + hk}};
  run(stream, s, true, pack, ws);
}

std::string cudnn_device_properties() {
  std::lock_guard<std::mutex> lk(g_mu);
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) fail("cuda", "cudaGetDevice failed");
  // The handle names the device. cuDNN 9.19 refuses a device id set after a handle (the
  // H200 run of 2026-11-27: BAD_PARAM, "fromSerialization || initialized"), so the id is the
  // second try, alone.
  std::vector<uint8_t> buf;
  auto describe = [&](bool by_handle) {
    fe::DeviceProperties dp;
    if (by_handle)
      dp.set_handle(handle());
    else
      dp.set_device_id(dev);
    fe::error_t e = dp.build();
    return e.is_good() ? dp.serialize(buf) : e;
  };
  fe::error_t e = describe(true);
  if (!e.is_good()) {
    const std::string first = e.get_message();
    e = describe(false);
    if (!e.is_good())
      fail("cuda", "cuDNN device properties: by handle: " + first + "; by device id: " +
                       e.get_message());
  }
  std::string text(buf.begin(), buf.end());
  while (!text.empty() && text.back() == '\0') text.pop_back();
  return text;
}

std::string cudnn_attention_check_offline(const std::string& props, const AttnShape& s,
                                          bool backward, int64_t* workspace) {
  std::string why = shape_refusal(s);
  if (!why.empty()) return why;
  try {
    auto dp = std::make_shared<fe::DeviceProperties>();
    std::vector<uint8_t> buf(props.begin(), props.end());
    buf.push_back(0);  // as cuDNN serialises it: with its terminating NUL
    fe::error_t e = dp->deserialize(buf);
    if (!e.is_good()) return "device properties: " + e.get_message();
    // The frontend asks the CUDA runtime for the SM version unless told: the description's
    // deviceVer, a key cuDNN requires. Its scale is assumed (not yet seen from a GPU): major *
    // 100 + minor * 10 (900 for sm_90) when 100 or more, else major * 10 + minor.
    const auto j = nlohmann::json::parse(props, nullptr, false);
    if (j.is_discarded() || !j.contains("deviceVer") || !j["deviceVer"].is_number_integer())
      return "device properties: no integer deviceVer in the description";
    const int ver = j["deviceVer"].get<int>();
    auto g = define(s, backward, ver >= 100 ? ver / 10 : ver);
    g->set_device_properties(dp);
    int64_t ws = 0;
    why = finish(*g, nullptr, &ws);
    if (why.empty() && workspace) *workspace = ws;
    return why;
  } catch (const std::exception& ex) {
    return ex.what();
  }
}

bool cudnn_only_driver_missing(const std::string& why) {
  return why.rfind("create_execution_plans:", 0) == 0 &&
         why.find("\"engineId\"") != std::string::npos &&
         why.find("RUNTIME_PREREQUISITE_MISSING") != std::string::npos;
}

#else  // no cuDNN frontend in this build

bool cudnn_attention_built() { return false; }

int64_t cudnn_attention_prepare(const AttnShape&, bool, std::string* why, bool* first) {
  static std::atomic<bool> said{false};  // the same reason for every shape: once
  if (first) *first = !said.exchange(true);
  if (why)
    *why = "this build has no cuDNN frontend (scripts/cudnn_frontend.sh; SW_CUDNN_FRONTEND_ROOT)";
  return -1;
}

void cudnn_attention_forward(void*, const AttnShape&, const uint16_t*, uint16_t*, float*, void*) {
  fail("cuda", "cuDNN attention: not in this build");
}

void cudnn_attention_backward(void*, const AttnShape&, const uint16_t*, const uint16_t*,
                              const uint16_t*, const float*, uint16_t*, void*) {
  fail("cuda", "cuDNN attention: not in this build");
}

std::string cudnn_device_properties() { fail("cuda", "cuDNN attention: not in this build"); }

std::string cudnn_attention_check_offline(const std::string&, const AttnShape&, bool, int64_t*) {
  return "this build has no cuDNN frontend";
}

bool cudnn_only_driver_missing(const std::string&) { return false; }

#endif

}  // namespace sw::cuda
