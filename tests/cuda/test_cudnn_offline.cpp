// cuDNN's fused attention graphs checked without a GPU (kernels/cuda/attention_cudnn.h,
// cudnn_attention_check_offline): for every GPU whose cuDNN device description a GPU run has
// left in tests/data/cudnn_devices/ (test_cuda_ops writes it where
// SHARDWISE_TEST_CUDNN_DEVICE_OUT says; scripts/gpu_build.sh asks for it), cuDNN must build the forward and backward graphs of the
// benchmark's shapes (GPT-2 124M at B 16, the 1.3B Llama at B 4) and of a grouped-query shape,
// in bf16 and fp16, through its ahead-of-time path: what a change to the graph would break is
// seen here, in CI, not on the next GPU. Where no CUDA driver is loaded (this build machine)
// cuDNN validates and lowers the graph and its heuristics offer engines, but cannot finalise
// an engine it compiles at run time: that case counts as offered (cudnn_only_driver_missing),
// a weaker check than a build. Without a description only the refusals are checked (a head
// dim cuDNN cannot take, a description that is not one): the library answers without a GPU.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/attention_cudnn.h"

using sw::DType;
using sw::cuda::AttnShape;
namespace fs = std::filesystem;

TEST_CASE("cudnn offline: refusals come back as reasons, without a GPU", "[cudnn]") {
  if (!sw::cuda::cudnn_attention_built()) {
    WARN("this build has no cuDNN attention");
    return;
  }
  const std::string odd = sw::cuda::cudnn_attention_check_offline("{}", {DType::BF16, 1, 8, 2, 2, 12}, false);
  CHECK(odd.find("head dim 12 is not a multiple of 8") != std::string::npos);
  const std::string bad = sw::cuda::cudnn_attention_check_offline("not a device", {DType::BF16, 1, 8, 2, 2, 64}, false);
  INFO(bad);
  CHECK_FALSE(bad.empty());
}

TEST_CASE("cudnn offline: the benchmark's attention graphs build for every recorded GPU", "[cudnn]") {
  if (!sw::cuda::cudnn_attention_built()) {
    WARN("this build has no cuDNN attention");
    return;
  }
  const fs::path dir = fs::path(SW_SOURCE_DIR) / "tests" / "data" / "cudnn_devices";
  std::vector<fs::path> files;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".json") files.push_back(e.path());
  if (files.empty()) {
    WARN("no GPU's cuDNN description in " << dir.string() << " yet (a GPU run writes one)");
    return;
  }
  int built = 0, offered = 0;
  for (const fs::path& f : files) {
    std::ifstream in(f);
    std::stringstream text;
    text << in.rdbuf();
    for (DType t : {DType::BF16, DType::F16})
      for (const AttnShape s : {AttnShape{t, 16, 1024, 12, 12, 64}, AttnShape{t, 4, 2048, 16, 16, 128},
                                AttnShape{t, 2, 512, 8, 2, 64}})
        for (const bool backward : {false, true}) {
          int64_t ws = -1;
          const std::string why =
              sw::cuda::cudnn_attention_check_offline(text.str(), s, backward, &ws);
          INFO(f.filename().string() << " " << sw::dtype_name(t) << " B " << s.B << " T " << s.T
                                     << " H " << s.H << " KVH " << s.KVH << " hd " << s.hd
                                     << (backward ? " backward" : " forward") << ": " << why);
          // Built (where a driver is loaded), or validated, lowered and offered an engine that
          // only the missing driver keeps from being built (this build machine).
          CHECK((why.empty() || sw::cuda::cudnn_only_driver_missing(why)));
          if (why.empty()) CHECK(ws >= 0);
          ++(why.empty() ? built : offered);
        }
  }
  WARN(built << " graphs built, " << offered
             << " validated and offered an engine that needs the CUDA driver to be built");
}
