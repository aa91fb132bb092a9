// Model: parameter counting and build_model (config validation, dispatch on the type).
#include "models/model.h"

#include <algorithm>

#include "core/error.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "models/tensor_units.h"

namespace sw {

int64_t Model::num_params() const {
  // A tied weight is one ParamSpec of one unit (used by several calls), so a plain sum counts
  // it once.
  int64_t n = 0;
  for (const auto& u : units)
    for (const ParamSpec& p : u->params()) n += numel(p.shape);
  return n;
}

Model stage_model(Model&& whole, const std::vector<int>& bounds, int size, int chunks, int rank) {
  const int P = static_cast<int>(whole.schedule.size()), S = size * chunks;
  if (size < 1 || chunks < 1 || rank < 0 || rank >= size)
    fail("pipeline", "pipeline rank " + std::to_string(rank) + " of " + std::to_string(size) +
                         " with " + std::to_string(chunks) + " stages each is not a stage");
  if (static_cast<int>(bounds.size()) != S + 1 || bounds.front() != 0 || bounds.back() != P)
    fail("pipeline", std::to_string(S) + " stages need " + std::to_string(S + 1) +
                         " bounds from 0 to the schedule's " + std::to_string(P) + " positions");
  for (int g = 0; g < S; ++g)
    if (bounds[size_t(g)] >= bounds[size_t(g) + 1])
      fail("pipeline", "stage " + std::to_string(g) + " is empty (positions " +
                           std::to_string(bounds[size_t(g)]) + " to " +
                           std::to_string(bounds[size_t(g) + 1]) + "): " + std::to_string(S) +
                           " stages over " + std::to_string(P) + " schedule positions");
  Model m;
  m.config = whole.config;
  m.tensor = whole.tensor;
  StageView& st = m.stage;
  st.rank = rank, st.size = size, st.chunks = chunks, st.bounds = bounds;
  st.global_positions = P;
  st.global_units = static_cast<int>(whole.units.size());
  std::vector<bool> used(whole.units.size(), false);
  for (int c = 0; c < chunks; ++c) {
    const int g = c * size + rank;
    for (int p = bounds[size_t(g)]; p < bounds[size_t(g) + 1]; ++p)
      used[size_t(whole.schedule[size_t(p)].unit)] = true;
  }
  std::vector<int> local(whole.units.size(), -1);
  for (size_t u = 0; u < whole.units.size(); ++u)
    if (used[u]) {
      local[u] = static_cast<int>(m.units.size());
      st.global_unit.push_back(static_cast<int>(u));
      m.units.push_back(std::move(whole.units[u]));
    }
  for (int c = 0; c < chunks; ++c) {
    st.chunk_begin.push_back(static_cast<int>(m.schedule.size()));
    const int g = c * size + rank;
    for (int p = bounds[size_t(g)]; p < bounds[size_t(g) + 1]; ++p) {
      const Call& call = whole.schedule[size_t(p)];
      m.schedule.push_back({local[size_t(call.unit)], call.call});
      st.global_pos.push_back(p);
    }
  }
  st.chunk_begin.push_back(static_cast<int>(m.schedule.size()));
  // Units also called by another rank's stages.
  std::vector<std::vector<int>> holders(whole.units.size());
  for (int g = 0; g < S; ++g)
    for (int p = bounds[size_t(g)]; p < bounds[size_t(g) + 1]; ++p) {
      std::vector<int>& h = holders[size_t(whole.schedule[size_t(p)].unit)];
      if (std::find(h.begin(), h.end(), g % size) == h.end()) h.push_back(g % size);
    }
  for (size_t u = 0; u < whole.units.size(); ++u) {
    if (local[u] < 0 || holders[u].size() < 2) continue;
    if (holders[u].size() > 2)
      fail("pipeline", "unit '" + m.units[size_t(local[u])]->name() + "' is called by " +
                           std::to_string(holders[u].size()) +
                           " pipeline ranks' stages; at most two may share a unit");
    st.shared.push_back(local[u]);
    st.shared_peer.push_back(holders[u][0] == rank ? holders[u][1] : holders[u][0]);
  }
  return m;
}

namespace {

void require_positive(const char* key, int64_t v) {
  if (v <= 0) fail("model", std::string("model.") + key + ": must be positive, got " + std::to_string(v));
}

std::string str(int v) { return std::to_string(v); }

// Validates cfg and fills in the defaults (n_kv_head, d_ff) so that later layers (export,
// planner) read the real sizes.
ModelConfig resolve(const ModelConfig& in) {
  ModelConfig c = in;
  const bool gpt2 = c.type == "gpt2", llama = c.type == "llama";
  if (!gpt2 && !llama)
    fail("model", "model.type: unknown model type '" + c.type + "' (valid: gpt2, llama)");
  require_positive("vocab_size", c.vocab_size);
  require_positive("n_layer", c.n_layer);
  require_positive("n_head", c.n_head);
  require_positive("d_model", c.d_model);
  require_positive("seq_len", c.seq_len);
  if (c.n_kv_head < 0) fail("model", "model.n_kv_head: must be >= 0 (0 = n_head), got " + str(c.n_kv_head));
  if (c.d_ff < 0) fail("model", "model.d_ff: must be >= 0 (0 = default), got " + str(c.d_ff));
  if (c.d_model % c.n_head != 0)
    fail("model", "model.n_head: " + str(c.n_head) + " does not divide model.d_model = " + str(c.d_model));
  if (c.n_kv_head == 0) c.n_kv_head = c.n_head;
  if (!(c.norm_eps > 0.f)) fail("model", "model.norm_eps: must be positive, got " + std::to_string(c.norm_eps));
  if (gpt2) {
    if (c.n_kv_head != c.n_head)
      fail("model", "model.n_kv_head: gpt2 has no grouped-query attention (use 0 or n_head = " +
                        str(c.n_head) + ", got " + str(c.n_kv_head) + ")");
    if (c.d_ff == 0) c.d_ff = 4 * c.d_model;
  } else {
    if (c.n_kv_head > c.n_head || c.n_head % c.n_kv_head != 0)
      fail("model", "model.n_kv_head: " + str(c.n_kv_head) + " does not divide model.n_head = " +
                        str(c.n_head));
    const int hd = c.d_model / c.n_head;
    if (hd % 2 != 0)
      fail("model", "model.n_head: head dimension d_model/n_head = " + str(hd) +
                        " must be even for RoPE");
    if (!(c.rope_theta > 0.f))
      fail("model", "model.rope_theta: must be positive, got " + std::to_string(c.rope_theta));
    if (c.d_ff == 0) {
      const int64_t f = (8 * static_cast<int64_t>(c.d_model) + 2) / 3;  // ceil(8d/3)
      c.d_ff = static_cast<int>((f + 63) / 64 * 64);
    }
  }
  return c;
}

}  // namespace

Model build_model(const ModelConfig& cfg, TensorSlice slice) {
  if (slice.size <= 1) return build_model(cfg);
  if (slice.rank < 0 || slice.rank >= slice.size)
    fail("model", "tensor rank " + str(slice.rank) + " outside the tensor group of " +
                      str(slice.size));
  Model m;
  m.config = resolve(cfg);
  m.tensor = slice;
  const ModelConfig& c = m.config;
  const int t = slice.size;
  const std::string deg = "parallelism.tensor_parallel_degree = " + str(t);
  auto divides = [&](const char* key, int v) {
    if (v % t != 0)
      fail("model", deg + " does not divide model." + key + " = " + str(v) +
                        " (tensor parallelism splits it)");
  };
  divides("n_head", c.n_head);
  divides("d_ff", c.d_ff);
  divides("vocab_size", c.vocab_size);
  divides("seq_len", c.seq_len);  // sequence parallelism splits the B*T rows
  if (c.type == "llama") {
    if (c.n_kv_head % t != 0 && t % c.n_kv_head != 0)
      fail("model", deg + " and model.n_kv_head = " + str(c.n_kv_head) +
                        ": neither divides the other (KV heads are split, or replicated when "
                        "there are fewer than the tensor degree)");
    build_llama_tensor(m);
  } else {
    build_gpt2_tensor(m);
  }
  return m;
}

Model build_model(const ModelConfig& cfg) {
  Model m;
  m.config = resolve(cfg);
  if (m.config.type == "gpt2")
    build_gpt2(m);
  else
    build_llama(m);
  return m;
}

}  // namespace sw
