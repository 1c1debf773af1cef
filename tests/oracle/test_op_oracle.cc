// Per-op checks against PyTorch: our f32 forward and gradients against torch in f64, on the same
// inputs and output cotangent.
#include <fstream>

#include "autograd/engine.h"
#include "core/rng.h"
#include "ops/functional.h"
#include "oracle_util.h"

namespace hap {
namespace {

using oracle::rel_norm_error;

struct OpCase {
  std::string name;
  std::string spec_json;  // {"op":..., "attrs":...}
  std::vector<Tensor> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> f;
};

void check_against_torch(const OpCase& c) {
  SCOPED_TRACE(c.name);
  std::vector<Tensor> ins;
  for (const Tensor& t : c.inputs) {
    Tensor x = t.clone();
    if (is_floating(x.dtype())) x.set_requires_grad(true);
    ins.push_back(x);
  }
  Tensor out = c.f(ins);
  Tensor gout = randn(out.shape(), 99, 5);
  out.backward(gout);

  auto dir = oracle::temp_dir(c.name);
  std::vector<std::pair<std::string, Tensor>> files;
  for (size_t i = 0; i < ins.size(); ++i)
    files.push_back({"in." + std::to_string(i), ins[i].detach()});
  files.push_back({"gout", gout});
  save_tensors((dir / "in.hapt").string(), files);
  std::ofstream((dir / "spec.json")) << c.spec_json;
  ASSERT_EQ(
      oracle::run_script("op_oracle.py", {(dir / "in.hapt").string(), (dir / "spec.json").string(),
                                          (dir / "out.hapt").string()}),
      0);
  auto ref = oracle::load_map((dir / "out.hapt").string());
  EXPECT_LE(rel_norm_error(out, ref.at("out")), 1e-5);
  for (size_t i = 0; i < ins.size(); ++i) {
    if (!is_floating(ins[i].dtype())) continue;
    SCOPED_TRACE("grad of input " + std::to_string(i));
    ASSERT_TRUE(ins[i].grad().defined());
    EXPECT_LE(rel_norm_error(ins[i].grad(), ref.at("grad." + std::to_string(i))), 1e-4);
  }
  std::filesystem::remove_all(dir);
}

Tensor ids(const Shape& s, int64_t v, uint64_t seed) {
  Tensor u = rand(s, seed, 3);
  std::vector<int64_t> x;
  for (double d : u.to_vector()) x.push_back(static_cast<int64_t>(d * v) % v);
  return Tensor::from_vector(x, s);
}

TEST(OpOracle, SoftmaxMatchesTorchOnLastAndInnerDims) {
  check_against_torch({"softmax_last",
                       R"({"op":"softmax","attrs":{"dim":-1}})",
                       {randn({3, 5, 37}, 1) * 3.0},
                       [](const std::vector<Tensor>& x) { return softmax(x[0], -1); }});
  check_against_torch({"softmax_mid",
                       R"({"op":"softmax","attrs":{"dim":1}})",
                       {randn({3, 5, 7}, 2)},
                       [](const std::vector<Tensor>& x) { return softmax(x[0], 1); }});
}

TEST(OpOracle, LogSoftmaxMatchesTorch) {
  check_against_torch({"log_softmax",
                       R"({"op":"log_softmax","attrs":{"dim":-1}})",
                       {randn({4, 41}, 3) * 4.0},
                       [](const std::vector<Tensor>& x) { return log_softmax(x[0], -1); }});
  check_against_torch({"log_softmax0",
                       R"({"op":"log_softmax","attrs":{"dim":0}})",
                       {randn({6, 5}, 4)},
                       [](const std::vector<Tensor>& x) { return log_softmax(x[0], 0); }});
}

TEST(OpOracle, LayerNormMatchesTorch) {
  check_against_torch(
      {"layer_norm",
       R"({"op":"layer_norm","attrs":{"eps":1e-5}})",
       {randn({2, 7, 33}, 5) * 2.0 + 1.0, randn({33}, 6), randn({33}, 7)},
       [](const std::vector<Tensor>& x) { return layer_norm(x[0], x[1], x[2], 1e-5); }});
}

TEST(OpOracle, BatchNormWithBatchStatisticsMatchesTorch) {
  check_against_torch(
      {"batch_norm4d",
       R"({"op":"batch_norm","attrs":{"eps":1e-5}})",
       {randn({5, 3, 4, 6}, 10) * 2.0 + 1.5, randn({3}, 11), randn({3}, 12)},
       [](const std::vector<Tensor>& x) { return batch_norm(x[0], x[1], x[2], 1e-5); }});
  check_against_torch(
      {"batch_norm2d",
       R"({"op":"batch_norm","attrs":{"eps":1e-3}})",
       {randn({9, 4}, 13) - 3.0, randn({4}, 14), randn({4}, 15)},
       [](const std::vector<Tensor>& x) { return batch_norm(x[0], x[1], x[2], 1e-3); }});
}

TEST(OpOracle, RmsNormMatchesTorch) {
  check_against_torch({"rms_norm",
                       R"({"op":"rms_norm","attrs":{"eps":1e-6}})",
                       {randn({3, 4, 19}, 8) * 2.0, randn({19}, 9)},
                       [](const std::vector<Tensor>& x) { return rms_norm(x[0], x[1], 1e-6); }});
}

TEST(OpOracle, GeluBothApproximationsMatchTorch) {
  check_against_torch({"gelu_tanh",
                       R"({"op":"gelu","attrs":{"approximate":"tanh"}})",
                       {randn({5, 77}, 10) * 3.0},
                       [](const std::vector<Tensor>& x) { return gelu(x[0], GeluApprox::Tanh); }});
  check_against_torch({"gelu_erf",
                       R"({"op":"gelu","attrs":{"approximate":"none"}})",
                       {randn({5, 77}, 11) * 3.0},
                       [](const std::vector<Tensor>& x) { return gelu(x[0], GeluApprox::None); }});
}

TEST(OpOracle, CrossEntropyWithIgnoreIndexMatchesTorch) {
  Tensor t = ids({29}, 53, 12);
  int64_t* p = t.data<int64_t>();
  p[3] = -100;
  p[17] = -100;
  check_against_torch(
      {"cross_entropy",
       R"({"op":"cross_entropy","attrs":{"ignore_index":-100}})",
       {randn({29, 53}, 13) * 2.0, t},
       [](const std::vector<Tensor>& x) { return cross_entropy(x[0], x[1], -100); }});
}

TEST(OpOracle, CrossEntropyLabelSmoothingAndReductionsMatchTorch) {
  Tensor t = ids({23}, 17, 30);
  int64_t* p = t.data<int64_t>();
  p[5] = p[11] = 2;  // ignored below
  for (const char* reduction : {"mean", "sum", "none"}) {
    const Reduction r = std::string(reduction) == "mean"  ? Reduction::Mean
                        : std::string(reduction) == "sum" ? Reduction::Sum
                                                          : Reduction::None;
    check_against_torch(
        {std::string("cross_entropy_smoothed_") + reduction,
         std::string(
             R"({"op":"cross_entropy","attrs":{"ignore_index":2,"label_smoothing":0.15,"reduction":")") +
             reduction + "\"}}",
         {randn({23, 17}, 31) * 2.0, t},
         [r](const std::vector<Tensor>& x) {
           return cross_entropy(x[0], x[1], CrossEntropyOptions{2, 0.15, r});
         }});
  }
}

TEST(OpOracle, AttentionCausalAndFullMatchTorch) {
  std::vector<Tensor> qkv = {randn({2, 3, 9, 5}, 14), randn({2, 3, 9, 5}, 15),
                             randn({2, 3, 9, 5}, 16)};
  check_against_torch({"attention_causal",
                       R"({"op":"attention","attrs":{"causal":true,"scale":null}})", qkv,
                       [](const std::vector<Tensor>& x) {
                         return scaled_dot_product_attention(x[0], x[1], x[2], true);
                       }});
  check_against_torch(
      {"attention_full", R"({"op":"attention","attrs":{"causal":false,"scale":0.3}})", qkv,
       [](const std::vector<Tensor>& x) {
         return scaled_dot_product_attention(x[0], x[1], x[2], false, 0.0, 0, 0, 0.3);
       }});
  // Padding: batch 0 attends to its first 6 keys, batch 1 to all but keys 1 and 4 (no query is
  // left without a key, even causal: PyTorch gives NaN there).
  std::vector<double> keep(18, 1.0);
  for (int j = 6; j < 9; ++j) keep[static_cast<size_t>(j)] = 0;
  keep[10] = keep[13] = 0;
  const Tensor mask = Tensor::from_vector(keep, {2, 9}, TensorOptions{}.with_dtype(DType::U8));
  const char* keys = R"("key_mask":[[1,1,1,1,1,1,0,0,0],[1,0,1,1,0,1,1,1,1]])";
  check_against_torch({"attention_padded_full",
                       std::string(R"({"op":"attention","attrs":{"causal":false,)") + keys + "}}",
                       qkv, [mask](const std::vector<Tensor>& x) {
                         return scaled_dot_product_attention(x[0], x[1], x[2], false, 0.0, 0, 0,
                                                             0.0, mask);
                       }});
  check_against_torch({"attention_padded_causal",
                       std::string(R"({"op":"attention","attrs":{"causal":true,)") + keys + "}}",
                       qkv, [mask](const std::vector<Tensor>& x) {
                         return scaled_dot_product_attention(x[0], x[1], x[2], true, 0.0, 0, 0, 0.0,
                                                             mask);
                       }});
}

TEST(OpOracle, EmbeddingMatchesTorchWithRepeatedIds) {
  Tensor i = ids({4, 6}, 11, 17);
  i.data<int64_t>()[0] = i.data<int64_t>()[1];  // a repeated id accumulates in the backward
  check_against_torch({"embedding",
                       R"({"op":"embedding","attrs":{}})",
                       {randn({11, 8}, 18), i},
                       [](const std::vector<Tensor>& x) { return embedding(x[0], x[1]); }});
}

TEST(OpOracle, Conv2dMatchesTorchWithStridePaddingDilationAndGroups) {
  check_against_torch(
      {"conv2d_grouped",
       R"({"op":"conv2d","attrs":{"stride":[2,1],"padding":[1,0],"dilation":[1,2],"groups":2}})",
       {randn({2, 6, 9, 8}, 20), randn({4, 3, 3, 2}, 21), randn({4}, 22)},
       [](const std::vector<Tensor>& x) {
         return conv2d(x[0], x[1], x[2], {2, 1}, {1, 0}, {1, 2}, 2);
       }});
  check_against_torch({"conv2d_3x3",
                       R"({"op":"conv2d","attrs":{"padding":[1,1]}})",
                       {randn({2, 3, 8, 8}, 23), randn({5, 3, 3, 3}, 24), randn({5}, 25)},
                       [](const std::vector<Tensor>& x) {
                         return conv2d(x[0], x[1], x[2], {1, 1}, {1, 1});
                       }});
}

TEST(OpOracle, PoolingMatchesTorch) {
  check_against_torch(
      {"max_pool2d",
       R"({"op":"max_pool2d","attrs":{"kernel":[2,3],"stride":[2,2],"padding":[1,1]}})",
       {randn({2, 3, 7, 8}, 26)},
       [](const std::vector<Tensor>& x) {
         return max_pool2d(x[0], {2, 3}, {2, 2}, {1, 1});
       }});
  check_against_torch({"max_pool2d_vgg",
                       R"({"op":"max_pool2d","attrs":{"kernel":[2,2],"stride":[2,2]}})",
                       {randn({2, 4, 8, 8}, 27)},
                       [](const std::vector<Tensor>& x) {
                         return max_pool2d(x[0], {2, 2});
                       }});
  check_against_torch(
      {"avg_pool2d",
       R"({"op":"avg_pool2d","attrs":{"kernel":[3,2],"stride":[1,2],"padding":[1,1]}})",
       {randn({2, 3, 7, 8}, 28)},
       [](const std::vector<Tensor>& x) {
         return avg_pool2d(x[0], {3, 2}, {1, 2}, {1, 1});
       }});
}

TEST(OpOracle, LogSumExpMatchesTorch) {
  check_against_torch({"logsumexp",
                       R"({"op":"logsumexp","attrs":{}})",
                       {randn({4, 37}, 29) * 5.0},
                       [](const std::vector<Tensor>& x) { return logsumexp(x[0]); }});
}

}  // namespace
}  // namespace hap
