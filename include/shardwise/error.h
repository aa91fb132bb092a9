/// Errors in two layers (see docs/ARCHITECTURE.md): @file
///  * user mistakes throw sw::Error whose message starts with the component, e.g.
///    "config: unknown key 'optimiser' (did you mean 'optimizer'?)";
///  * C-boundary checks (SW_CHECK, MPI_CHECK, CUDA_CHECK) report file, line and rank.
#pragma once
#include <stdexcept>
#include <string>

namespace sw {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Throws sw::Error("<component>: <message>").
[[noreturn]] void fail(const std::string& component, const std::string& message);

/// Internal invariant violated: prints file:line (and MPI rank when known) and aborts.
[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

/// Rank shown in internal error messages; set by the communication layer (-1 = unknown).
void set_error_rank(int rank);
int error_rank();

}  // namespace sw

#define SW_CHECK(cond, msg)                                              \
  do {                                                                   \
    if (!(cond)) ::sw::check_failed(#cond, __FILE__, __LINE__, (msg));   \
  } while (0)
// ---- Reference documentation (Doxygen): the members above without a comment of their own.

/// @fn sw::error_rank()
/// The rank set_error_rank set (-1: unknown).

/// @def SW_CHECK(cond, msg)
/// An internal invariant: when `cond` is false, check_failed reports the expression, file,
/// line, rank and `msg`, and aborts. Not for user mistakes (those throw sw::Error).
