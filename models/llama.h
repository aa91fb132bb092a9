// Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU, no biases) as units,
// with the variants of the Llama family (Llama 2 / 3, Mistral, Qwen2):
//   [0]      "embed": embed_tokens (V,C); y = embed_tokens[tokens].
//   [1..L]   "layers.<i>":
//            x2 = x + o_proj(attn(rope(q_proj|k_proj|v_proj (input_layernorm(x)))))
//            y  = x2 + down_proj(silu(gate_proj(h)) * up_proj(h)),  h = post_attention_layernorm(x2)
//   [L+1]    "head": norm (C), lm_head (V,C), cross-entropy (fused, ops.lmhead_xent).
// Schedule: (0,0), (1,0), ..., (L+1,0).
// tie_embeddings (Llama 3.2 1B): [0] is "embed_head" (embed_tokens, norm: call 0 the
// embedding, call 1 the head with lm_head = embed_tokens), no [L+1]; schedule (0,0), (1,0),
// ..., (L,0), (0,1), as GPT-2's.
// qkv_bias (Qwen2): biases on q_proj, k_proj, v_proj (not o_proj), declared after down_proj.
// RoPE: rope_theta, and rope_scaling "llama3" (Llama 3.1+) through kernels/ops.h RopeSpec.
// q_proj, k_proj, v_proj are declared consecutively (and gate_proj, up_proj), so in the flat
// parameter buffer they usually form one (H+2*KVH)*hd x C matrix (one (2F) x C matrix): the
// block then runs one GEMM whose output rows are [q | k | v] (resp. [gate | up]), exactly the
// packed layouts the attention/RoPE/SwiGLU kernels take. When the pointers handed in are not
// contiguous (alignment padding, or separately allocated tensors) it falls back to one GEMM
// per matrix writing the same packed rows.
// Parameter names are the Hugging Face LlamaForCausalLM names without the "model." prefix
// ("layers.0.self_attn.q_proj.weight", "embed_tokens.weight", "norm.weight",
// "lm_head.weight"); hf_name is the full HF name; nothing is transposed.
// Init: matrices N(0, 0.02), o_proj and down_proj N(0, 0.02/sqrt(2L)) (GPT-2's residual
// scaling), norm weights 1; weight decay on 2-D parameters only.
// Activations, the fused loss call and logits: as for GPT-2 (see gpt2.h).
#pragma once
#include "models/model.h"

namespace sw {

// Appends the Llama units and schedule to m (m.config is already validated and resolved).
void build_llama(Model& m);
// RoPE's frequencies as the config gives them (theta, and the llama3 scaling).
RopeSpec rope_spec(const ModelConfig& c);

}  // namespace sw
