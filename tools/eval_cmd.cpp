#include "tools/eval_cmd.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "checkpoint/export.h"
#include "core/error.h"
#include "engine/config.h"
#include "engine/data.h"
#include "engine/trainer.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "sharding/sharded_model.h"

namespace fs = std::filesystem;

namespace sw {

EvalTotals evaluate_files(ShardedModel& sm, const std::string& spec, int64_t vocab_size, int T,
                          int B) {
  SW_CHECK(T >= 1 && B >= 1, "evaluate_files: bad shape");
  EvalTotals tot;
  std::vector<int32_t> in(static_cast<size_t>(B) * T), tg(in.size());
  for (const std::string& path : resolve_token_files(spec)) {
    const TokenFile f(path, vocab_size, 2);  // at least one target
    ++tot.files;
    const uint8_t* mask = f.mask();
    const int64_t n_windows = (f.size() - 1 + T - 1) / T;  // the last one may be short
    for (int64_t w0 = 0; w0 < n_windows; w0 += B) {
      const int rows = static_cast<int>(std::min<int64_t>(B, n_windows - w0));
      int64_t counted = 0;
      for (int r = 0; r < rows; ++r) {
        const int64_t start = (w0 + r) * T;
        const int len = static_cast<int>(std::min<int64_t>(T, f.size() - 1 - start));  // targets
        int32_t* ir = in.data() + static_cast<size_t>(r) * T;
        int32_t* tr = tg.data() + static_cast<size_t>(r) * T;
        f.copy(start, len, ir);
        f.copy(start + 1, len, tr);
        std::fill(ir + len, ir + T, 0);
        std::fill(tr + len, tr + T, -1);
        for (int t = 0; t < len; ++t) {
          if (mask && !mask[start + 1 + t]) tr[t] = -1;
          counted += tr[t] >= 0;
        }
      }
      tot.windows += rows;
      if (counted == 0) continue;
      Batch b;
      b.B = rows, b.T = T, b.tokens = in.data(), b.targets = tg.data();
      tot.loss_sum += sm.eval_loss(b) * static_cast<double>(counted);
      tot.counted += counted;
    }
  }
  return tot;
}

namespace {

struct EvalArgs {
  std::string config, weights, data;
  std::vector<std::string> overrides;
  int batch = 0;  // 0: the config's micro-batch
};

int cmd_eval(const EvalArgs& a) {
  const TrainConfig cfg = load_config_for_weights(a.config, a.overrides, a.weights);
  refuse_tensor_parallel_gaps(cfg, "eval");
  std::error_code ec;
  if (!fs::exists(a.weights, ec)) fail("eval", "weights '" + a.weights + "' not found");
  Model model = build_model(cfg.model);
  ShardedModel sm(model, ops_for(Device::cpu()), cfg.seed);
  import_safetensors(sm, a.weights);
  const int B = a.batch > 0 ? a.batch : std::max(1, cfg.micro_batch);
  const EvalTotals t = evaluate_files(sm, a.data, cfg.model.vocab_size, cfg.model.seq_len, B);
  if (t.counted == 0) fail("eval", a.data + ": no target counted (every mask byte is 0)");
  const double loss = t.mean();
  std::printf("loss %.6f perplexity %.4f tokens %lld (%d file%s, %lld windows of %d)\n", loss,
              std::exp(loss), static_cast<long long>(t.counted), t.files, t.files > 1 ? "s" : "",
              static_cast<long long>(t.windows), cfg.model.seq_len);
  std::fflush(stdout);
  return 0;
}

}  // namespace

void add_eval_command(cli::Command& top) {
  auto a = std::make_shared<EvalArgs>();
  cli::Command c = top.sub(
      "eval",
      "the mean loss and perplexity of weights over token files\n"
      "\n"
      "Builds the model from the config's `model` block (a Hugging Face directory's\n"
      "config.json under the config's own model keys), loads --weights, and evaluates every\n"
      "token of --data in non-overlapping windows of model.seq_len (each token but a file's\n"
      "first is a target once; targets a mask file X.mask beside X.bin excludes are not\n"
      "counted). Prints one line: loss (nats per counted token), perplexity exp(loss), tokens\n"
      "counted, files and windows.");
  c.config(a->config);
  c.text("--weights", a->weights, "W",
         "weights: a Hugging Face directory, a safetensors file or index (as `sample`)")
      .required();
  c.text("--data", a->data, "FILE",
         "token files: a file, a directory (its *.bin) or a glob, as data.train")
      .required();
  c.integer("--batch", a->batch, 1, 1 << 20, "B",
            "rows per forward pass (default: the config's micro-batch)");
  c.overrides(a->overrides);
  c.on_run([a] { return cmd_eval(*a); });
}

}  // namespace sw
