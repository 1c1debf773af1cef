// Kernel lab: causal scaled dot-product attention (bench/kernels/lab.h) on [batch, heads, seq,
// head_dim] queries, keys and values, forward and backward. FLOPs are counted as flash-attention's
// benchmarks count them, the useful work: 4 B H T^2 D forward and 2.5 times that backward, halved
// for the causal mask; an implementation that materialises every score does twice the work.
#include "bench/kernels/lab.h"
#include "ops/functional.h"

namespace hap::lab {
namespace {

std::vector<Case> cases() {
  return {
      {"attention_causal",
       [](const Sizes& s, Device d, DType t) {
         const Shape shape = {s.batch, s.heads, s.seq, s.head_dim};
         const Tensor q = input(shape, 1, d, t), k = input(shape, 2, d, t),
                      v = input(shape, 3, d, t), gy = input(shape, 4, d, t);
         return std::function<std::vector<Tensor>()>([=] {
           const Tensor ql = leaf(q), kl = leaf(k), vl = leaf(v);
           const Tensor y = scaled_dot_product_attention(ql, kl, vl, true);
           y.backward(gy);
           return std::vector<Tensor>{y, ql.grad(), kl.grad(), vl.grad()};
         });
       },
       [](const Sizes& s, DType) {
         const double f =
             4.0 * static_cast<double>(s.batch * s.heads * s.seq * s.seq * s.head_dim) / 2;
         return std::vector<Traffic>{{ops::OpKind::Attention, 0, f},
                                     {ops::OpKind::AttentionBackward, 0, 2.5 * f}};
       }},
  };
}

}  // namespace
}  // namespace hap::lab

int main(int argc, char** argv) {
  return hap::lab::run_lab(argc, argv, "attention", hap::lab::cases());
}
