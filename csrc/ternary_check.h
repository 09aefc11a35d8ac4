// Input checks shared by the op's CUDA and CPU faces (csrc/ternary_ops.cpp, csrc/cpu/ternary_cpu.cpp).
//
// Error messages are built here with std::to_string and handed to TORCH_CHECK as ONE string,
// which c10::str passes through without an ostringstream. Formatting numbers through c10's
// stream (TORCH_CHECK(cond, "...", int)) segfaulted inside std::ostream::_M_insert<long> on
// the lent H200's build (nvcc 13 / g++ 13 against the torch 2.11 wheel: a num_put facet from
// a second libstdc++, by the backtrace), so a user's bad input crashed the process.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>

namespace ternary_check {
inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, const std::string& v) { s += v; }
inline void append(std::string& s, int64_t v) { s += std::to_string(v); }
inline void append(std::string& s, int v) { s += std::to_string(v); }
inline void append(std::string& s, c10::ScalarType v) { s += c10::toString(v); }
inline void append(std::string& s, c10::IntArrayRef v) {
  s += "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  s += "]";
}
template <typename... A>
std::string cat(const A&... parts) {
  std::string s;
  (append(s, parts), ...);
  return s;
}
}  // namespace ternary_check

// TERNARY_CHECK_ARG(prefix, cond, parts...): raise (a c10::Error, Python's RuntimeError) with the
// prefix and the parts as one message unless cond holds.
#define TERNARY_CHECK_ARG(prefix, cond, ...)                                          \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      const std::string ternary_msg_ = ::ternary_check::cat(prefix, __VA_ARGS__);     \
      TORCH_CHECK(false, ternary_msg_);                                               \
    }                                                                                 \
  } while (0)
