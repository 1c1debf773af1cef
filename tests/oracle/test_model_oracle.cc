// The zoo's models against their PyTorch twins (tests/oracle/model_oracle.py, computing in f64
// from our f32 initial weights and inputs): the loss within 1e-5 and every parameter's gradient
// within 1e-4 (norm-wise relative). Each model is built by name at a small size whose dimensions
// divide nothing evenly; its inputs are drawn from its declared InputSpecs.
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "models/bert.h"
#include "models/zoo.h"
#include "oracle_util.h"

namespace hap {
namespace {

using oracle::rel_norm_error;

struct OracleCase {
  std::string model;
  std::map<std::string, nn::OptionValue> options;  // over the entry's defaults
  int64_t batch;
  // Tensors the twin needs beside the parameters and inputs (what the model draws from our
  // generator, which the oracle cannot replay).
  std::function<NamedTensors(nn::Model&, const NamedTensors& batch)> extra = {};
};

// A masked-LM's corrupted ids and targets for this step, as its loss will draw them.
NamedTensors bert_masks(nn::Model& m, const NamedTensors& batch) {
  auto [inputs, targets] = dynamic_cast<nn::BERT&>(m).masked(batch.at(0).second);
  return {{"mlm.inputs", inputs}, {"mlm.targets", targets}};
}

// A batch for `inputs`: floats N(0, 1), class indices uniform over their classes.
NamedTensors draw_inputs(const std::vector<nn::InputSpec>& inputs, uint64_t seed) {
  NamedTensors out;
  uint64_t stream = 0;
  for (const nn::InputSpec& in : inputs) {
    Tensor u = rand(in.shape, seed, stream++);
    if (in.dtype == DType::F32) {
      out.push_back({in.name, randn(in.shape, seed, stream++)});
      continue;
    }
    EXPECT_EQ(in.dtype, DType::I64) << in.name;
    EXPECT_GT(in.num_classes, 0) << in.name;
    std::vector<int64_t> ids;
    for (double r : u.to_vector())
      ids.push_back(std::min<int64_t>(static_cast<int64_t>(r * static_cast<double>(in.num_classes)),
                                      in.num_classes - 1));
    out.push_back({in.name, Tensor::from_vector(ids, in.shape)});
  }
  return out;
}

nlohmann::json options_json(const nn::Options& o) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : o.values()) std::visit([&, key = k](const auto& x) { j[key] = x; }, v);
  return j;
}

// A small BERT (or BERT-MoE): sizes that divide nothing, with `more` options over them.
OracleCase bert_case(std::map<std::string, nn::OptionValue> more,
                     std::function<NamedTensors(nn::Model&, const NamedTensors&)> extra,
                     const std::string& model = "bert") {
  OracleCase c{model,
               {{"vocab_size", int64_t{37}},
                {"seq_len", int64_t{9}},
                {"n_layer", int64_t{2}},
                {"n_head", int64_t{3}},
                {"n_embd", int64_t{18}},
                {"hidden", int64_t{22}}},
               3,
               std::move(extra)};
  for (auto& [k, v] : more) c.options[k] = v;
  return c;
}

class ModelOracle : public ::testing::TestWithParam<OracleCase> {};

TEST_P(ModelOracle, LossAndEveryGradientMatchTorch) {
  const OracleCase& c = GetParam();
  const nn::ModelEntry& entry = nn::find_model(c.model);
  nn::Options options(entry.options);
  for (const auto& [k, v] : c.options) options.set(k, v);
  auto model = nn::build_model(entry, options, c.batch, 4242);
  model->train();
  const NamedTensors batch = draw_inputs(model->inputs(c.batch), 99);

  const std::string dir = oracle::temp_dir(c.model).string();
  NamedTensors in = model->named_parameters();
  const NamedTensors buffers = model->named_buffers();
  in.insert(in.end(), buffers.begin(), buffers.end());
  in.insert(in.end(), batch.begin(), batch.end());
  if (c.extra) {
    const NamedTensors more = c.extra(*model, batch);
    in.insert(in.end(), more.begin(), more.end());
  }
  save_tensors(dir + "/in.hapt", in);
  const nlohmann::json cfg = {
      {"model", c.model}, {"options", options_json(options)}, {"dtype", "float64"}};
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  ASSERT_EQ(oracle::run_script("model_oracle.py",
                               {dir + "/in.hapt", dir + "/config.json", dir + "/out.hapt"}),
            0);
  const std::map<std::string, Tensor> ref = oracle::load_map(dir + "/out.hapt");
  std::filesystem::remove_all(dir);

  Tensor loss = model->loss(nn::Batch(batch.begin(), batch.end()));
  loss.backward();
  const double ref_loss = ref.at("loss").item();
  EXPECT_LE(std::abs(loss.item() - ref_loss) / std::abs(ref_loss), 1e-5)
      << loss.item() << " vs " << ref_loss;
  for (auto& [name, p] : model->named_parameters()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(p.grad().defined());
    ASSERT_TRUE(ref.count("grad." + name));
    EXPECT_LE(rel_norm_error(p.grad(), ref.at("grad." + name)), 1e-4);
  }
  // Running statistics after the training forward, and an evaluation forward that uses them.
  for (const auto& [name, b] : buffers) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(ref.count("buffer." + name));
    EXPECT_LE(rel_norm_error(b, ref.at("buffer." + name)), 1e-5);
  }
  if (!buffers.empty()) {
    // The loss of these small models barely moves with the statistics; the gradients do.
    model->zero_grad();
    model->eval();
    Tensor eval_loss = model->loss(nn::Batch(batch.begin(), batch.end()));
    eval_loss.backward();
    model->train();
    const double ref_eval = ref.at("eval_loss").item();
    EXPECT_LE(std::abs(eval_loss.item() - ref_eval) / std::abs(ref_eval), 1e-5)
        << eval_loss.item() << " vs " << ref_eval;
    double largest_change = 0;  // from the training forward's gradients
    for (auto& [name, p] : model->named_parameters()) {
      SCOPED_TRACE("evaluation: " + name);
      ASSERT_TRUE(p.grad().defined());
      EXPECT_LE(rel_norm_error(p.grad(), ref.at("eval_grad." + name)), 1e-4);
      largest_change = std::max(largest_change, rel_norm_error(p.grad(), ref.at("grad." + name)));
    }
    EXPECT_GT(largest_change, 0.1)
        << "the evaluation forward should normalise by the running statistics";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Zoo, ModelOracle,
    ::testing::Values(
        OracleCase{"vgg19",
                   {{"width", int64_t{3}}, {"hidden", int64_t{13}}, {"num_classes", int64_t{7}}},
                   5},
        OracleCase{"vgg19",
                   {{"depth", int64_t{11}},
                    {"image_size", int64_t{64}},
                    {"in_channels", int64_t{2}},
                    {"width", int64_t{5}},
                    {"hidden", int64_t{9}},
                    {"num_classes", int64_t{3}}},
                   3},
        OracleCase{"vgg19",
                   {{"width", int64_t{3}},
                    {"hidden", int64_t{13}},
                    {"num_classes", int64_t{7}},
                    {"batch_norm", true}},
                   5},
        OracleCase{"vit",
                   {{"image_size", int64_t{12}},
                    {"patch_size", int64_t{3}},
                    {"in_channels", int64_t{2}},
                    {"num_classes", int64_t{5}},
                    {"n_layer", int64_t{2}},
                    {"n_head", int64_t{3}},
                    {"n_embd", int64_t{18}},
                    {"hidden", int64_t{20}}},
                   3},
        bert_case({}, nullptr),
        bert_case({{"objective", std::string("mlm")}, {"mask_prob", 0.3}}, bert_masks),
        bert_case({{"num_experts", int64_t{5}}, {"capacity_factor", 1.2}}, nullptr, "bert_moe")),
    [](const auto& info) {
      std::string objective;
      if (info.param.options.count("objective"))
        objective = "_" + std::get<std::string>(info.param.options.at("objective"));
      return info.param.model + objective + "_" + std::to_string(info.index);
    });

}  // namespace
}  // namespace hap
