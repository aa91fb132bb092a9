// Consolidated weights in and out as safetensors, with Hugging Face tensor names and layouts
// (ParamSpec::hf_name / hf_transpose), so other tools load them directly.
#pragma once
#include <string>

namespace sw {

class ShardedModel;

// Writes every parameter (f32) under its HF name, transposed where HF stores the transpose.
// Metadata records the model config. Written to a temporary file then renamed.
void export_hf_safetensors(const ShardedModel& model, const std::string& path);

// Loads a file written by export_hf_safetensors (or by Hugging Face for the same shapes), a
// model.safetensors.index.json, or a directory holding either, into the model: each rank reads
// only the tensors it holds part of (import_hf_weights, checkpoint/hf_import.h). Throws
// sw::Error naming the file and tensor on a missing tensor, a shape mismatch or a malformed
// file.
void import_safetensors(ShardedModel& model, const std::string& path);

}  // namespace sw
