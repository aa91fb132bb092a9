// `shardwise eval CFG --weights W --data SPEC` (tools/eval_cmd.cpp): the mean loss of trained
// weights over whole token files, printed with its perplexity and the number of tokens counted.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tools/cli.h"

namespace sw {

class ShardedModel;

struct EvalTotals {
  double loss_sum = 0;   // sum of the counted targets' losses (nats)
  int64_t counted = 0;   // targets counted (mask 1, or every target without a mask)
  int64_t windows = 0;   // rows evaluated
  int files = 0;
  double mean() const { return counted > 0 ? loss_sum / static_cast<double>(counted) : 0.0; }
};

// Every file of `spec` (a file, directory or glob: resolve_token_files) in non-overlapping
// windows of T targets: window k of a file of n tokens has inputs tokens[kT, kT + T) and
// targets tokens[kT + 1, kT + T] (the last window shorter: its missing targets are -1, its
// missing inputs 0), so each token but a file's first is a target exactly once; a target whose
// mask byte (X.mask beside X.bin) is 0 is not counted. Rows go B at a time through
// `sm.eval_loss`.
EvalTotals evaluate_files(ShardedModel& sm, const std::string& spec, int64_t vocab_size, int T,
                          int B);

// Declares `eval` under `top`.
void add_eval_command(cli::Command& top);

}  // namespace sw
