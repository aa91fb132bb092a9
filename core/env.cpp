// The declaration of every SHARDWISE_* environment variable (core/env.h) and its readers.
// A switch is one row of table(): the readers refuse a name that is not here, and README.md's
// table (between its env-switches markers) is generated from these rows, so adding a switch
// is one row plus the code that reads it. tests/core/test_env.cpp checks that every
// SHARDWISE_* name in the source tree is declared.
#include "core/env.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "core/error.h"

namespace sw {

namespace {

using K = EnvKind;

// In the table's order: what users set first, then what diagnoses a run, then the tests' own.
// A function's static, not a global: the allocators read their switches during other files'
// static initialisation, which may come before this file's.
const std::vector<EnvVar>& table() {
  static const std::vector<EnvVar> vars = {
      // ---- Running ------------------------------------------------------------------------
      {"SHARDWISE_CUDA_DEVICE", K::Integer, "a device index", "the local rank modulo the GPUs",
       "run", "the GPU of `\"device\": \"cuda\"` on this rank", 0, 1 << 20},
      {"SHARDWISE_HARDWARE", K::Text, "a path",
       "`$XDG_CACHE_HOME/shardwise/hardware.json`, else `~/.cache/shardwise/hardware.json`", "run",
       "the hardware profile `shardwise plan` and the `\"auto\"` keys plan with"},
      {"SHARDWISE_CUDA_ATTENTION", K::Text, "`cudnn` \\| `cublas` \\| `flash`", "`cudnn`", "run",
       "the attention path of bf16 / fp16 compute on a GPU (fp32 always takes `flash`)"},
      {"SHARDWISE_CUDA_LT", K::Switch, "", "on", "run",
       "cuBLASLt adds a linear's bias and the residual in the product's epilogue; `0`: separate "
       "passes"},
      {"SHARDWISE_CUDA_CACHING", K::Switch, "", "on", "run",
       "the caching device allocator; `0`: every buffer from cudaMalloc / cudaFree"},
      {"SHARDWISE_CACHING_ALLOCATOR", K::Switch, "", "on", "run",
       "the caching host allocator; `0`: every buffer from aligned_alloc / free"},
      {"SHARDWISE_HOST_UPDATE_ASYNC", K::Switch, "", "on", "run",
       "with a device, the host's optimizer update of offloaded state runs on its own thread "
       "while the device goes on; `0`: in line"},
      {"SHARDWISE_COMM_TIMEOUT_S", K::Number, "seconds in [0.01, 1e9]", "300", "run",
       "the watchdog's limit per collective (a config's `comm_timeout_s` > 0 wins)", 0.01, 1e9},
      {"SHARDWISE_COMM_CHUNK_KB", K::Integer, "KiB in [1, 1048576]", "512", "run",
       "the pipeline chunk of the host collectives' ring and direct algorithms (equal on all "
       "ranks)",
       1, 1 << 20},
      {"SHARDWISE_COMM_SPIN_US", K::Integer, "microseconds in [0, 1e7]", "50", "run",
       "how long the communication thread busy-polls before it sleeps", 0, 1e7},
      {"SHARDWISE_CKPT_THREADS", K::Integer, "1 or 2", "2", "run",
       "threads that copy, checksum and load checkpoint shards (1: the calling thread alone)", 1,
       2},
      {"SHARDWISE_CKPT_O_DIRECT", K::Switch, "", "on", "run",
       "checkpoint shards bypass the page cache where the file system allows it; `0`: buffered"},
      {"SHARDWISE_AIO_DISABLE_URING", K::Flag, "", "off", "run",
       "the io queue uses its pread / pwrite threads even where io_uring is available"},
      {"SHARDWISE_IO_UNCACHED", K::Flag, "", "off", "run",
       "offload writes are flushed and dropped from the page cache as they complete (measures "
       "the disk, not the cache)"},
      {"SHARDWISE_LOWP_PATH", K::Text,
       "`native` \\| `fused` \\| `emulated` \\| `onednn` \\| `tuned`", "a rule of the CPU's "
       "features", "run",
       "forces the CPU's bf16 matrix-product path for the process (`tuned`: timed per shape; "
       "`onednn`: also for products of 16-bit operands, which otherwise run own kernels)"},
      // ---- Diagnosing a run ---------------------------------------------------------------
      {"SHARDWISE_CUDA_OP_TIMES", K::Text, "`1` or a path", "off", "debug",
       "each CUDA op's total device time, printed at exit (`1`) or written to the path"},
      {"SHARDWISE_COMM_DEBUG", K::Integer, "0 or 1", "0", "debug",
       "check before each collective that all ranks issue the same one (as `comm_debug`)", 0, 1},
      {"SHARDWISE_NCCL_VERBOSE", K::Flag, "", "off", "debug",
       "say on stderr why a device group is not made on NCCL"},
      {"SHARDWISE_NCCL_BLOCKING", K::Flag, "", "off", "debug",
       "NCCL communicators in blocking mode (calls wait inside NCCL instead of polling "
       "against the time-out)"},
      {"SHARDWISE_PROFILE_DEVICE_TIMES", K::Flag, "", "off", "debug",
       "the profiler settles each action's interval on the stream that ran it where the compute "
       "stream is no GPU's: the CPU's stamped events, the simulated device's streams (tests the "
       "GPU path without one)"},
      {"SHARDWISE_LOWP_VERBOSE", K::Flag, "", "off", "debug",
       "print the bf16 products' path (vdpbf16ps or FMA, by vendor, beside the measured flop "
       "ratio) and each shape's choice under SHARDWISE_LOWP_PATH=tuned"},
      // ---- The test suite -----------------------------------------------------------------
      {"SHARDWISE_COMM_DELAY_US", K::Integer, "microseconds in [0, 1e8]", "0", "test",
       "sleep a random 0..N µs before each collective (exposes missing waits)", 0, 1e8},
      {"SHARDWISE_EXEC_DELAY_US", K::Integer, "microseconds ≥ 0", "0", "test",
       "sleep a random 0..N µs before each executed action (exposes missing waits)", 0, 1e9},
      {"SHARDWISE_HOST_UPDATE_DELAY_US", K::Integer, "microseconds ≥ 0", "0", "test",
       "sleep before each host update (a unit read before its update settled then differs)", 0,
       1e9},
      {"SHARDWISE_CUDA_ATTENTION_CHUNK", K::Integer, "query rows ≥ 1", "by memory (≥ 64 rows)",
       "test", "query rows per chunk of the cuBLAS attention path", 1, 1 << 30},
      {"SHARDWISE_IO_FAIL_AFTER", K::Text, "`BYTES[:ERRNO]`", "off", "test",
       "the io queue fails the request crossing BYTES with ERRNO (default EIO)"},
      {"SHARDWISE_AIO_FAIL_AFTER", K::Text, "`BYTES[:ERRNO]`", "off", "test",
       "the aio engine fails the piece crossing BYTES with ERRNO (default EIO)"},
      {"SHARDWISE_CKPT_TEST_DELAY_MS", K::Integer, "milliseconds ≥ 0", "0", "test",
       "sleep inside each checkpoint save (a kill can land in the middle)", 0, 1e9},
      {"SHARDWISE_SIM_GUARD", K::Switch, "", "on", "test",
       "the simulated accelerator's memory faults when the host touches it; `0`: readable (its "
       "benchmarks)"},
      {"SHARDWISE_TEST_VERBOSE", K::Flag, "", "off", "test",
       "kernel and CUDA tests print their measured errors (how tolerances are set)"},
      {"SHARDWISE_TEST_PARITY_VERBOSE", K::Flag, "", "off", "test",
       "the sharding parity tests print each step's losses"},
      {"SHARDWISE_TEST_MP_VERBOSE", K::Flag, "", "off", "test",
       "the mixed-precision training test prints its loss curves"},
      {"SHARDWISE_TEST_GRADCHECK_VERBOSE", K::Flag, "", "off", "test",
       "the models' finite-difference checks print each parameter's error"},
      {"SHARDWISE_TEST_NO_TMPFS", K::Flag, "", "off", "test",
       "the checkpoint full-disk test uses its file-size limit instead of a small tmpfs"},
      {"SHARDWISE_TEST_AIO_BACKEND", K::Text, "`io_uring` \\| `threads`", "aio's default", "test",
       "the io engine the NVMe offload tests force (ctest's `_offload_nvme_<backend>` entries)"},
      {"SHARDWISE_TEST_CUDNN_DEVICE_OUT", K::Text, "a path", "not written", "test",
       "where the cuDNN test writes the device description cuDNN serialises"},
  };
  return vars;
}

const char* kind_word(EnvKind k) {
  switch (k) {
    case K::Flag:
      return "flag";
    case K::Switch:
      return "switch";
    case K::Integer:
      return "integer";
    case K::Number:
      return "number";
    case K::Text:
      return "text";
  }
  return "?";
}

// The variable's value when set and not empty.
const char* value_of(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

const EnvVar& declared(const char* name, EnvKind kind) {
  const EnvVar& v = env_var(name);
  if (v.kind != kind)
    throw std::logic_error(std::string("env: ") + name + " is declared as a " + kind_word(v.kind) +
                           ", read as a " + kind_word(kind));
  return v;
}

bool is_off(const char* v) {
  return std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0 || std::strcmp(v, "false") == 0;
}

[[noreturn]] void bad_value(const EnvVar& e, const char* v, const std::string& expected) {
  fail("env", std::string(e.name) + "='" + v + "': expected " + expected);
}

std::string range_words(const EnvVar& e) {
  auto num = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.15g", x);
    return std::string(buf);
  };
  std::string r = "[";  // built by appending: GCC 12 warns (-Wrestrict) at "[" + string&&
  r += num(e.lo);
  r += ", ";
  r += num(e.hi);
  return r + "]";
}

}  // namespace

const std::vector<EnvVar>& env_vars() { return table(); }

const EnvVar& env_var(const char* name) {
  for (const EnvVar& v : table())
    if (std::strcmp(name, v.name) == 0) return v;
  throw std::logic_error(std::string("env: ") + name + " is not declared (core/env.cpp)");
}

bool env_flag(const char* name) {
  declared(name, K::Flag);
  const char* v = value_of(name);
  return v && !is_off(v);
}

bool env_switch(const char* name) {
  declared(name, K::Switch);
  const char* v = std::getenv(name);
  return !(v && is_off(v));
}

std::optional<std::string> env_text(const char* name) {
  declared(name, K::Text);
  const char* v = value_of(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

std::optional<int64_t> env_int(const char* name) {
  const EnvVar& e = declared(name, K::Integer);
  const char* v = value_of(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  if (errno != 0 || *end != '\0' || double(x) < e.lo || double(x) > e.hi)
    bad_value(e, v, "an integer in " + range_words(e));
  return int64_t{x};
}

std::optional<double> env_number(const char* name) {
  const EnvVar& e = declared(name, K::Number);
  const char* v = value_of(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(x >= e.lo && x <= e.hi))
    bad_value(e, v, "a number in " + range_words(e));
  return x;
}

std::string env_vars_markdown() {
  std::string out =
      "| variable | for | values | when not set | meaning |\n"
      "| --- | --- | --- | --- | --- |\n";
  for (const EnvVar& e : table()) {
    std::string values = *e.values ? e.values : "";
    if (values.empty())
      values = e.kind == K::Flag ? "`1` (on; `0`, `off`, `false`: off)"
                                 : "`0`, `off` or `false` (off)";
    out += std::string("| `") + e.name + "` | " + e.use + " | " + values + " | " + e.fallback +
           " | " + e.doc + " |\n";
  }
  return out;
}

}  // namespace sw
