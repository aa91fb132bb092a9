// `shardwise data prepare`: text files or JSONL into token files (engine/data.h), with a
// tokenizer (engine/tokenizer.h); see data_prepare.cpp.
#pragma once
#include <string>
#include <vector>

struct PrepareArgs {
  std::vector<std::string> inputs;
  std::string out, val;  // val "" = no validation file
  double val_fraction = 0.1;
  std::string tokenizer;  // "" = bytes through the original path (cmd_data_prepare)
  bool jsonl = false;     // one JSON object per line: "text", or "prompt" and "completion"
  int threads = 0;        // 0 = every core
  bool quiet = false;     // no progress bar
};

// Streams the inputs through the tokenizer on a.threads threads and writes a.out (and a.val,
// and the mask files beside them for prompt / completion JSONL). Prints what it wrote and the
// tokens, seconds and tokens/s. Throws sw::Error("data: ...") on bad input.
int prepare_tokenized(const PrepareArgs& a);

// Creates the directory that will hold `path` (and its parents); throws sw::Error("data: ...").
void ensure_parent_dir(const std::string& path);
