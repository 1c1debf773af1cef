// Kernel lab: the token embedding (bench/kernels/lab.h): rows token ids gathered from a
// [vocabulary, width] table, and its backward (the table's gradient: every row's gradient added
// to its token's row, deterministically).
#include "bench/kernels/lab.h"
#include "ops/functional.h"

namespace hap::lab {
namespace {

std::vector<Case> cases() {
  return {
      {"embedding",
       [](const Sizes& s, Device d, DType t) {
         const Tensor w = input({s.vocab, s.width}, 1, d, t),
                      gy = input({s.rows, s.width}, 2, d, t);
         std::vector<int64_t> ids(static_cast<size_t>(s.rows));
         for (int64_t i = 0; i < s.rows; ++i)  // repeats, as text has
           ids[static_cast<size_t>(i)] = (i * 104729 + 7) % (s.vocab / 4);
         const Tensor tokens = Tensor::from_vector(ids, {s.rows}).to(d);
         return std::function<std::vector<Tensor>()>([=] {
           const Tensor wl = leaf(w);
           const Tensor y = embedding(wl, tokens);
           y.backward(gy);
           return std::vector<Tensor>{y, wl.grad()};
         });
       },
       [](const Sizes& s, DType t) {
         const double n = static_cast<double>(s.rows * s.width);
         const double table = static_cast<double>(s.vocab * s.width);
         const double ids = 8.0 * static_cast<double>(s.rows);
         return std::vector<Traffic>{
             {ops::OpKind::Embedding, 2 * n * bytes_of(t) + ids},
             {ops::OpKind::EmbeddingBackward, (n + table) * bytes_of(t) + ids}};
       }},
  };
}

}  // namespace
}  // namespace hap::lab

int main(int argc, char** argv) {
  return hap::lab::run_lab(argc, argv, "embedding", hap::lab::cases());
}
