// Whether op calls record history (thread-local, on by default).
#pragma once

namespace hap::autograd {

class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

}  // namespace hap::autograd

namespace hap {

// Disables recording for its scope, like torch::NoGradGuard.
class NoGradGuard {
 public:
  NoGradGuard() : prev_(autograd::GradMode::is_enabled()) {
    autograd::GradMode::set_enabled(false);
  }
  ~NoGradGuard() { autograd::GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace hap
