// Kernel lab: the AdamW update (bench/kernels/lab.h) of GPT-2 124M's parameters in one launch, as
// the trainer runs it: 148 tensors (GPT-2's count) holding `params` f32 values with their
// gradients and moments (master weights and optimizer state stay f32 in bf16 runs too).
#include "bench/kernels/lab.h"
#include "ops/attrs.h"
#include "ops/functional.h"

namespace hap::lab {
namespace {

constexpr int64_t kTensors = 148;

std::vector<Case> cases() {
  return {
      {"adamw_update",
       [](const Sizes& s, Device d, DType t) {
         const DType p = t == DType::F64 ? DType::F64 : DType::F32;
         std::vector<Tensor> state;
         ops::OptimizerAttrs a;
         a.beta1 = 0.9;
         a.beta2 = 0.95;
         for (int64_t i = 0; i < kTensors; ++i) {
           const int64_t n = s.params / kTensors + (i < s.params % kTensors ? 1 : 0);
           state.push_back(input({n}, 4 * i + 1, d, p));         // parameter
           state.push_back(input({n}, 4 * i + 2, d, p));         // gradient
           state.push_back(input({n}, 4 * i + 3, d, p) * 0.01);  // first moment
           state.push_back(input({n}, 4 * i + 4, d, p) * input({n}, 4 * i + 4, d, p) * 1e-4);
           a.lr.push_back(1e-3);
           a.weight_decay.push_back(i % 2 ? 0.1 : 0.0);
           a.step.push_back(10);
         }
         return std::function<std::vector<Tensor>()>([=] {
           ops::call(ops::OpKind::AdamWUpdate, state, a);
           std::vector<Tensor> params;
           for (size_t i = 0; i < state.size(); i += 4) params.push_back(state[i]);
           return params;
         });
       },
       [](const Sizes& s, DType) {
         // Reads the parameter, gradient and both moments; writes the parameter and the moments.
         return std::vector<Traffic>{
             {ops::OpKind::AdamWUpdate, 7.0 * static_cast<double>(s.params) * 4}};
       }},
  };
}

}  // namespace
}  // namespace hap::lab

int main(int argc, char** argv) {
  return hap::lab::run_lab(argc, argv, "adamw", hap::lab::cases());
}
