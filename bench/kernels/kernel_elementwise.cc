// Kernel lab: elementwise kernels (bench/kernels/lab.h): a sum of two [rows, 4 x width]
// activations (the residual's shape, four times wider: an MLP's hidden layer), and GELU forward
// and backward on the MLP's hidden activations.
#include "bench/kernels/lab.h"
#include "ops/functional.h"

namespace hap::lab {
namespace {

std::vector<Case> cases() {
  auto n = [](const Sizes& s) { return static_cast<double>(s.rows * 4 * s.width); };
  return {
      {"add",
       [](const Sizes& s, Device d, DType t) {
         const Tensor a = input({s.rows, 4 * s.width}, 1, d, t),
                      b = input({s.rows, 4 * s.width}, 2, d, t);
         return std::function<std::vector<Tensor>()>([=] { return std::vector<Tensor>{a + b}; });
       },
       [=](const Sizes& s, DType t) {
         return std::vector<Traffic>{{ops::OpKind::Add, 3 * n(s) * bytes_of(t)}};
       }},
      {"gelu",
       [](const Sizes& s, Device d, DType t) {
         const Tensor x = input({s.rows, 4 * s.width}, 3, d, t),
                      gy = input({s.rows, 4 * s.width}, 4, d, t);
         return std::function<std::vector<Tensor>()>([=] {
           const Tensor xl = leaf(x);
           const Tensor y = gelu(xl);
           y.backward(gy);
           return std::vector<Tensor>{y, xl.grad()};
         });
       },
       [=](const Sizes& s, DType t) {
         return std::vector<Traffic>{{ops::OpKind::Gelu, 2 * n(s) * bytes_of(t)},
                                     {ops::OpKind::GeluBackward, 3 * n(s) * bytes_of(t)}};
       }},
  };
}

}  // namespace
}  // namespace hap::lab

int main(int argc, char** argv) {
  return hap::lab::run_lab(argc, argv, "elementwise", hap::lab::cases());
}
