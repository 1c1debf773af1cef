// Errors: HAP_CHECK for user errors (typed exception with the bad value and the expectation),
// HAP_ASSERT for internal invariants.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace hap {

// A user error: bad input, bad shapes, bad config. The message says what was wrong, where, and
// what was expected.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// A broken internal invariant: a bug in HAP, not in the caller's input.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& msg) : std::logic_error(msg) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

}  // namespace hap

#define HAP_CHECK(cond, ...)                                             \
  do {                                                                   \
    if (!(cond)) throw ::hap::Error(::hap::detail::concat(__VA_ARGS__)); \
  } while (0)

#define HAP_ASSERT(cond, ...)                                                               \
  do {                                                                                      \
    if (!(cond))                                                                            \
      throw ::hap::InternalError(::hap::detail::concat(                                     \
          "internal error at ", __FILE__, ":", __LINE__, ": ", #cond, " ", ##__VA_ARGS__)); \
  } while (0)
