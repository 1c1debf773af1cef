#include "models/init.h"

#include <sstream>

#include "autograd/grad_mode.h"

namespace hap::nn {

std::string ParamInit::str() const {
  std::ostringstream os;
  switch (kind) {
    case Kind::Keep:
      os << "keep";
      break;
    case Kind::Constant:
      os << "constant(" << a << ")";
      break;
    case Kind::Normal:
      os << "normal(" << a << ", " << b << ")";
      break;
    case Kind::Uniform:
      os << "uniform(" << a << ", " << b << ")";
      break;
  }
  return os.str();
}

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

void init_parameter(const Tensor& local, const ParamInit& rule, uint64_t seed,
                    std::string_view full_name, const LogicalSlice& slice) {
  HAP_CHECK(local.defined(), "init_parameter: parameter '", full_name, "' is undefined");
  NoGradGuard no_grad;
  uint64_t stream = param_stream(full_name);
  switch (rule.kind) {
    case ParamInit::Kind::Keep:
      return;
    case ParamInit::Kind::Constant:
      local.fill_(rule.a);
      return;
    case ParamInit::Kind::Normal:
      HAP_CHECK(rule.b >= 0, "init of '", full_name, "': standard deviation must be >= 0, got ",
                rule.b);
      fill_normal(local, seed, stream, rule.a, rule.b, slice);
      return;
    case ParamInit::Kind::Uniform:
      HAP_CHECK(rule.a <= rule.b, "init of '", full_name, "': uniform bounds must satisfy lo <= hi",
                ", got [", rule.a, ", ", rule.b, "]");
      fill_uniform(local, seed, stream, rule.a, rule.b, slice);
      return;
  }
}

}  // namespace hap::nn
