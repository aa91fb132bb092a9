/// A model: its units and the order they run in. GPT-2 and Llama-style models are built from @file
/// a ModelConfig; users build their own by subclassing Unit (see examples/).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardwise/unit.h"

namespace sw {

struct ModelConfig {
  std::string type = "gpt2";  ///< gpt2 | llama
  int vocab_size = 256;
  int n_layer = 4;
  int n_head = 4;
  int n_kv_head = 0;  ///< llama; 0 = n_head
  int d_model = 128;
  int d_ff = 0;       ///< llama; 0 = the usual 8/3*d rounded up to a multiple of 64 (gpt2: 4*d)
  int seq_len = 128;  ///< maximum context (gpt2: positions table size)
  float rope_theta = 10000.f;
  float norm_eps = 1e-5f;
  /// Whether lm_head shares the embedding's weight. Unset = the type's default, as transformers'
  /// configs have it: gpt2 ties, llama does not (Llama 3.2 1B's config.json says true). Read it
  /// through tied().
  std::optional<bool> tie_embeddings;
  /// llama: biases on the q, k and v projections (Qwen2).
  bool qkv_bias = false;
  /// llama: RoPE frequency scaling. "none", or "llama3" (Llama 3.1+: frequencies with wavelength
  /// above original_max_position_embeddings / low_freq_factor are divided by factor, those below
  /// .../ high_freq_factor kept, a smooth blend between).
  std::string rope_scaling = "none";
  float rope_factor = 8.f, rope_low_freq_factor = 1.f, rope_high_freq_factor = 4.f;
  int rope_original_max_pos = 8192;
  /// The Hugging Face architecture the model was imported from or exports as ("" = the type's
  /// own: GPT2LMHeadModel, LlamaForCausalLM; also MistralForCausalLM, Qwen2ForCausalLM).
  std::string hf_architecture;

  bool tied() const { return tie_embeddings.value_or(type == "gpt2"); }
};

struct Call {
  int unit = 0;  ///< index into Model::units
  int call = 0;  ///< which of that unit's calls
};

/// Which tensor rank a model is built for (tensor parallelism: build_model(cfg, slice) builds
/// the units' parts for rank `rank` of `size`; size 1: the whole model).
struct TensorSlice {
  int rank = 0, size = 1;
};

/// Pipeline parallelism: the part of a model's schedule one pipeline rank runs (stage_model).
/// The whole schedule is cut into S = size * chunks stages of consecutive positions, stage g =
/// [bounds[g], bounds[g+1]); rank r holds stages r, r + size, r + 2 size, ... (its chunks, in
/// order; chunks > 1: interleaved virtual stages). Activations flow stage g -> g + 1.
struct StageView {
  int rank = 0, size = 1;   ///< pipeline rank and degree
  int chunks = 1;           ///< stages per rank (virtual stages)
  std::vector<int> bounds;  ///< S + 1 global positions
  /// This rank's model: chunk c runs local positions [chunk_begin[c], chunk_begin[c + 1]).
  std::vector<int> chunk_begin;
  std::vector<int> global_unit;  ///< per local unit: its index in the whole model
  std::vector<int> global_pos;   ///< per local position: its position in the whole schedule
  int global_positions = 0, global_units = 0;
  /// Local units another pipeline rank holds too (GPT-2's tied embedding and head: the first
  /// and the last stage) and that rank: their gradients are summed between the two.
  std::vector<int> shared, shared_peer;
  bool split() const { return size > 1; }
  int stage_of_chunk(int c) const { return c * size + rank; }
};

class Model {
 public:
  ModelConfig config;
  TensorSlice tensor;  ///< the tensor rank its units are built for
  StageView stage;     ///< pipeline parallelism: the positions this rank runs (size 1: all)
  std::vector<std::unique_ptr<Unit>> units;
  std::vector<Call> schedule;  ///< forward order; backward runs it in reverse
  int d_model() const { return config.d_model; }
  /// Floats of the residual stream per token on this rank: d_model, or d_model / t with tensor
  /// (and sequence) parallelism, whose units hold N / t of the rows.
  int residual_width() const { return config.d_model / tensor.size; }
  int64_t num_params() const;  ///< sum over units, tied weights counted once
  /// Schedule position p's call takes the residual stream as input (every one but the whole
  /// schedule's first, the embedding) / is the loss call (the whole schedule's last).
  bool takes_input(size_t p) const {
    return stage.split() ? stage.global_pos[p] > 0 : p > 0;
  }
  bool is_loss(size_t p) const {
    return stage.split() ? stage.global_pos[p] + 1 == stage.global_positions
                         : p + 1 == schedule.size();
  }
};

/// The stage of pipeline rank `rank` of `size` (chunks stages each) of `whole` (after
/// wrap_blocks): its units (those its positions call, in whole-model order) and positions.
/// `bounds`: size * chunks + 1 increasing global positions from 0 to the schedule's length.
/// Throws sw::Error("pipeline", ...) naming a bad bound.
Model stage_model(Model&& whole, const std::vector<int>& bounds, int size, int chunks, int rank);

/// Builds GPT-2 or Llama from the config (throws sw::Error naming the bad field).
Model build_model(const ModelConfig& cfg);
/// The same, split for tensor rank slice.rank of slice.size (tensor parallelism; throws one line
/// naming the key a degree does not divide: heads, KV heads, d_ff, vocab_size).
Model build_model(const ModelConfig& cfg, TensorSlice slice);

}  // namespace sw
// ---- Reference documentation (Doxygen): the members above without a comment of their own.

/// @struct sw::ModelConfig
/// The shapes of a built-in GPT-2 or Llama (build_model), as a config file's `model` block
/// sets them; a custom model fills in the fields that describe it (vocab_size, d_model,
/// n_layer, seq_len) for the planner and checkpoints.

/// @var sw::ModelConfig::vocab_size
/// Tokens in the vocabulary.

/// @var sw::ModelConfig::n_layer
/// Transformer blocks.

/// @var sw::ModelConfig::n_head
/// Attention heads.

/// @var sw::ModelConfig::d_model
/// Width of the residual stream.

/// @var sw::ModelConfig::rope_theta
/// llama: RoPE's base.

/// @var sw::ModelConfig::norm_eps
/// The norms' epsilon.

/// @var sw::ModelConfig::rope_factor
/// llama3 RoPE scaling: the factor slow frequencies are divided by.

/// @var sw::ModelConfig::rope_low_freq_factor
/// llama3 RoPE scaling: low_freq_factor.

/// @var sw::ModelConfig::rope_high_freq_factor
/// llama3 RoPE scaling: high_freq_factor.

/// @var sw::ModelConfig::rope_original_max_pos
/// llama3 RoPE scaling: original_max_position_embeddings.

/// @fn sw::ModelConfig::tied() const
/// Whether the LM head shares the embedding's weight (tie_embeddings, else the type's default).

/// @struct sw::Call
/// One position of a model's schedule: which unit runs which of its calls.

/// @var sw::TensorSlice::rank
/// This tensor rank.

/// @var sw::TensorSlice::size
/// The tensor-parallel degree (1: the whole model).

/// @var sw::StageView::rank
/// This pipeline rank.

/// @var sw::StageView::global_positions
/// Positions of the whole model's schedule.

/// @var sw::StageView::global_units
/// Units of the whole model.

/// @var sw::StageView::shared_peer
/// Per shared unit: the pipeline rank that holds it too.

/// @fn sw::StageView::split() const
/// True when the model is split into pipeline stages.

/// @fn sw::StageView::stage_of_chunk(int c) const
/// The global stage of this rank's chunk `c`.

/// @class sw::Model
/// A model: its units and the order they run in (schedule). Built by build_model for GPT-2 and
/// Llama, or by hand from Units of your own.

/// @var sw::Model::config
/// Its shapes (see ModelConfig).

/// @var sw::Model::units
/// The units, each called by one or more schedule positions.

/// @fn sw::Model::d_model() const
/// config.d_model.

/// @fn sw::Model::is_loss(size_t p) const
/// Whether schedule position `p` is the loss call (see takes_input).
