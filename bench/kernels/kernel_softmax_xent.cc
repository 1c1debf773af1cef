// Kernel lab: softmax and cross-entropy kernels (bench/kernels/lab.h): a row softmax over
// attention-score-shaped rows (batch x heads x seq rows of seq columns) forward and backward, and
// the cross-entropy of [rows, vocabulary] logits (GPT-2's 50257) with its gradient.
#include "bench/kernels/lab.h"
#include "ops/functional.h"

namespace hap::lab {
namespace {

Tensor targets(int64_t rows, int64_t vocab, Device d) {
  std::vector<int64_t> t(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) t[static_cast<size_t>(i)] = (i * 7919 + 13) % vocab;
  return Tensor::from_vector(t, {rows}).to(d);
}

std::vector<Case> cases() {
  return {
      {"softmax",
       [](const Sizes& s, Device d, DType t) {
         const Shape shape = {s.batch * s.heads * s.seq, s.seq};
         const Tensor x = input(shape, 1, d, t), gy = input(shape, 2, d, t);
         return std::function<std::vector<Tensor>()>([=] {
           const Tensor xl = leaf(x);
           const Tensor y = softmax(xl, -1);
           y.backward(gy);
           return std::vector<Tensor>{y, xl.grad()};
         });
       },
       [](const Sizes& s, DType t) {
         const double n = static_cast<double>(s.batch * s.heads * s.seq * s.seq);
         return std::vector<Traffic>{{ops::OpKind::Softmax, 2 * n * bytes_of(t)},
                                     {ops::OpKind::SoftmaxBackward, 3 * n * bytes_of(t)}};
       }},
      {"cross_entropy",
       [](const Sizes& s, Device d, DType t) {
         const Tensor logits = input({s.rows, s.vocab}, 3, d, t);
         const Tensor y = targets(s.rows, s.vocab, d);
         return std::function<std::vector<Tensor>()>([=] {
           const Tensor l = leaf(logits);
           const Tensor loss = cross_entropy(l, y);
           loss.backward();
           return std::vector<Tensor>{loss, l.grad()};
         });
       },
       [](const Sizes& s, DType t) {
         const double n = static_cast<double>(s.rows * s.vocab);
         return std::vector<Traffic>{{ops::OpKind::CrossEntropy, n * bytes_of(t)},
                                     {ops::OpKind::CrossEntropyBackward, 2 * n * bytes_of(t)}};
       }},
  };
}

}  // namespace
}  // namespace hap::lab

int main(int argc, char** argv) {
  return hap::lab::run_lab(argc, argv, "softmax_xent", hap::lab::cases());
}
