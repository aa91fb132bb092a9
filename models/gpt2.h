// GPT-2 (Radford et al. 2019; llm.c's layout) as units:
//   [0]      "embed_head": wte (V,C), wpe (maxT,C), ln_f, and lm_head (V,C) when untied.
//            Call 0: embedding y = wte[tokens] + wpe[t]. Call 1: ln_f, then the LM head
//            (weights wte when tied) and cross-entropy (fused, ops.lmhead_xent).
//   [1..L]   "h.<i>": pre-LN block
//            x2 = x + c_proj(attn(c_attn(ln_1(x))));  y = x2 + mlp.c_proj(gelu(mlp.c_fc(ln_2(x2))))
// Schedule: (0,0), (1,0), ..., (L,0), (0,1).
// Parameter names are global ("h.3.attn.c_attn.weight"); hf_name gives the Hugging Face GPT-2
// name and hf_transpose marks the Conv1D weights HF stores as (in, out).
// Init (GPT-2 / nanoGPT): matrices N(0, 0.02), the residual projections (attn.c_proj,
// mlp.c_proj) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1. Weight decay applies to
// every 2-D parameter, embeddings included (as nanoGPT does), never to biases or norms.
//
// Activations and the loss call (both models): training forwards keep what backward needs in
// ctx.saved; eval forwards (training == false) put everything in ctx.scratch and keep nothing.
// The loss call is fused: when it runs with training && ctx.grads != null it accumulates the
// LM-head weight gradient into ctx.grads during forward and stashes d(normed x) in ctx.saved,
// so its backward only runs the final norm's backward. When it runs with ctx.grads == null
// (a forward meant to be recomputed), its backward does the LM-head gradient instead. So an
// engine that drops and recomputes the loss call's activations must run that call's first
// forward without grads; re-running a fused loss forward would count the head gradient twice.
// With ctx.logits set (inference) the loss call writes the last position's (B, V) logits.
#pragma once
#include "models/model.h"

namespace sw {

// Appends GPT-2's units and schedule to m (m.config is already validated and resolved).
void build_gpt2(Model& m);

}  // namespace sw
