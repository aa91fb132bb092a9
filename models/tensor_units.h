// Tensor-parallel GPT-2 and Llama units (models/tensor_units.cpp): Megatron-LM's splits with
// sequence parallelism, for the tensor rank model.tensor says.
#pragma once
#include "models/model.h"

namespace sw {

void build_gpt2_tensor(Model& m);
void build_llama_tensor(Model& m);

}  // namespace sw
