// Kernel lab: causal scaled dot-product attention (bench/kernels/lab.h) on [batch, heads, seq,
// head_dim] queries, keys and values, forward and backward. FLOPs are counted as flash-attention's
// benchmarks count them, the useful work: 4 B H T^2 D forward and 2.5 times that backward, halved
// for the causal mask; an implementation that materialises every score does twice the work. In
// bf16 the flash kernels run, and the second case times the f32 route beside them.
#include <cstdlib>

#include "bench/kernels/lab.h"
#include "ops/functional.h"

namespace hap::lab {
namespace {

// Causal attention forward and backward; `flash` false sets HAP_FLASH_ATTENTION=0 around the
// step, so that bf16 takes the f32 route (materialised scores) instead of the flash kernels.
Case attention_case(const std::string& name, bool flash) {
  return {name,
          [flash](const Sizes& s, Device d, DType t) {
            const Shape shape = {s.batch, s.heads, s.seq, s.head_dim};
            const Tensor q = input(shape, 1, d, t), k = input(shape, 2, d, t),
                         v = input(shape, 3, d, t), gy = input(shape, 4, d, t);
            return std::function<std::vector<Tensor>()>([=] {
              if (!flash) setenv("HAP_FLASH_ATTENTION", "0", 1);
              const Tensor ql = leaf(q), kl = leaf(k), vl = leaf(v);
              const Tensor y = scaled_dot_product_attention(ql, kl, vl, true);
              y.backward(gy);
              if (!flash) unsetenv("HAP_FLASH_ATTENTION");
              return std::vector<Tensor>{y, ql.grad(), kl.grad(), vl.grad()};
            });
          },
          [](const Sizes& s, DType) {
            const double f =
                4.0 * static_cast<double>(s.batch * s.heads * s.seq * s.seq * s.head_dim) / 2;
            return std::vector<Traffic>{{ops::OpKind::Attention, 0, f},
                                        {ops::OpKind::AttentionBackward, 0, 2.5 * f}};
          }};
}

std::vector<Case> cases() {
  // (In f32 both cases run the same kernels: the flash kernels take bf16 only.)
  return {attention_case("attention_causal", true),
          attention_case("attention_causal_no_flash", false)};
}

}  // namespace
}  // namespace hap::lab

int main(int argc, char** argv) {
  return hap::lab::run_lab(argc, argv, "attention", hap::lab::cases());
}
