// Kernel lab: normalisation kernels (bench/kernels/lab.h): layer norm and RMS norm over the
// residual stream [rows, width], forward and backward (the input's and the weights' gradients).
#include "bench/kernels/lab.h"
#include "ops/functional.h"

namespace hap::lab {
namespace {

// Reads x and writes y (forward); reads x and the output gradient and writes the input gradient
// (backward), plus the per-feature weights and their gradients.
std::vector<Traffic> norm_traffic(const Sizes& s, DType t, ops::OpKind fwd, ops::OpKind bwd,
                                  int weights) {
  const double n = static_cast<double>(s.rows * s.width), w = static_cast<double>(s.width);
  return {{fwd, (2 * n + weights * w) * bytes_of(t)},
          {bwd, (3 * n + 2 * weights * w) * bytes_of(t)}};
}

std::vector<Case> cases() {
  return {
      {"layer_norm",
       [](const Sizes& s, Device d, DType t) {
         const Tensor x = input({s.rows, s.width}, 1, d, t), w = input({s.width}, 2, d, t),
                      b = input({s.width}, 3, d, t), gy = input({s.rows, s.width}, 4, d, t);
         return std::function<std::vector<Tensor>()>([=] {
           const Tensor xl = leaf(x), wl = leaf(w), bl = leaf(b);
           const Tensor y = layer_norm(xl, wl, bl);
           y.backward(gy);
           return std::vector<Tensor>{y, xl.grad(), wl.grad(), bl.grad()};
         });
       },
       [](const Sizes& s, DType t) {
         return norm_traffic(s, t, ops::OpKind::LayerNorm, ops::OpKind::LayerNormBackward, 2);
       }},
      {"rms_norm",
       [](const Sizes& s, Device d, DType t) {
         const Tensor x = input({s.rows, s.width}, 5, d, t), w = input({s.width}, 6, d, t),
                      gy = input({s.rows, s.width}, 7, d, t);
         return std::function<std::vector<Tensor>()>([=] {
           const Tensor xl = leaf(x), wl = leaf(w);
           const Tensor y = rms_norm(xl, wl);
           y.backward(gy);
           return std::vector<Tensor>{y, xl.grad(), wl.grad()};
         });
       },
       [](const Sizes& s, DType t) {
         return norm_traffic(s, t, ops::OpKind::RmsNorm, ops::OpKind::RmsNormBackward, 1);
       }},
  };
}

}  // namespace
}  // namespace hap::lab

int main(int argc, char** argv) {
  return hap::lab::run_lab(argc, argv, "norms", hap::lab::cases());
}
