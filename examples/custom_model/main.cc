// A model of its own, trained through the public API only (#include <hap/hap.h>, link hap::train):
// a residual MLP regressor with its own dataset, trained by hap::train::Trainer on one process,
// or on MPI ranks with a program synthesized for a cluster file, numerically the same run.
//
//   custom_model [--steps N] [--save FILE]
//   mpirun -np 3 custom_model --cluster three-devices.yaml [--steps N] [--save FILE]
//
// Prints the plan (on ranks), a loss line every 10 steps, and with --save writes the final
// parameters and optimizer state as logical tensors (safetensors). Exits 0 when the loss fell below
// 10% of the first step's, 1 when it did not, 2 for a bad command line.
#include <hap/hap.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

// x + fc2(tanh(fc1(x))): [N, width] -> [N, width]
class Block : public hap::nn::Module {
 public:
  explicit Block(int64_t width) : Module("Block") {
    fc1 = register_module("fc1",
                          std::make_shared<hap::nn::Linear>(hap::nn::LinearOptions(width, width)));
    fc2 = register_module("fc2",
                          std::make_shared<hap::nn::Linear>(hap::nn::LinearOptions(width, width)));
  }
  hap::Tensor forward(const hap::Tensor& x) const {
    return x + fc2->forward(hap::tanh(fc1->forward(x)));
  }

  std::shared_ptr<hap::nn::Linear> fc1, fc2;
};

// y = head(blocks(embed(x))), trained to the mean squared error. Its inputs: x [batch, 3], y
// [batch, 1]. Each block of the list becomes its own segment of the plan (its own ratios).
class Regressor : public hap::nn::Model {
 public:
  Regressor(int64_t width, int depth, uint64_t seed) : Model("Regressor") {
    embed = register_module("embed",
                            std::make_shared<hap::nn::Linear>(hap::nn::LinearOptions(3, width)));
    blocks = register_module("blocks", std::make_shared<hap::nn::ModuleList>());
    for (int i = 0; i < depth; ++i) blocks->push_back(std::make_shared<Block>(width));
    head = register_module("head",
                           std::make_shared<hap::nn::Linear>(hap::nn::LinearOptions(width, 1)));
    reset_parameters(seed);
    set_random_seed(seed);
  }

  std::vector<hap::nn::InputSpec> inputs(int64_t batch) const override {
    return {{"x", {batch, 3}, hap::DType::F32}, {"y", {batch, 1}, hap::DType::F32}};
  }

  hap::Tensor loss(const hap::nn::Batch& batch) override {
    hap::Tensor h = embed->forward(batch.at("x"));
    for (size_t i = 0; i < blocks->size(); ++i) h = blocks->at<Block>(i)->forward(h);
    hap::Tensor diff = head->forward(h) - batch.at("y");
    return hap::mean(diff * diff);
  }

  // Small tanh networks train better with 1/sqrt(fan-in) weights than GPT-2's N(0, 0.02).
  std::optional<hap::nn::ParamInit> init_rule(const std::string& name,
                                              const hap::Tensor& p) const override {
    if (name.ends_with(".weight"))
      return hap::nn::ParamInit::normal(0.0, 1.0 / std::sqrt(static_cast<double>(p.size(1))));
    return std::nullopt;
  }

  std::shared_ptr<hap::nn::Linear> embed, head;
  std::shared_ptr<hap::nn::ModuleList> blocks;
};

// Examples (x, y) with x ~ N(0, 1)^3 and y = sin(x0) + 0.5 x1 x2 - 0.3 x0^2. Row r of batch i is
// drawn from the counter-based generator at (seed, stream i, element), so a rank draws exactly its
// rows of the batch and nothing else.
class Waves : public hap::train::Dataset {
 public:
  Waves(int64_t batch, uint64_t seed) : batch_(batch), seed_(seed) {}

  hap::nn::Batch read(hap::train::Split split, uint64_t index, int64_t row_begin,
                      int64_t row_end) const override {
    const int64_t rows = row_end - row_begin;
    hap::LogicalSlice slice{{batch_, 3}, {row_begin, 0}};
    hap::Tensor x = hap::Tensor::empty({rows, 3});
    const uint64_t stream = (split == hap::train::Split::kVal ? uint64_t{1} << 40 : 0) + index;
    hap::fill_normal(x, seed_, stream, 0.0, 1.0, slice);
    std::vector<double> v = x.to_vector(), y;
    for (int64_t i = 0; i < rows; ++i) {
      const double* r = &v[static_cast<size_t>(3 * i)];
      y.push_back(std::sin(r[0]) + 0.5 * r[1] * r[2] - 0.3 * r[0] * r[0]);
    }
    return {{"x", x}, {"y", hap::Tensor::from_vector(y, {rows, 1})}};
  }

  std::string describe() const override { return "waves: y = sin(x0) + 0.5 x1 x2 - 0.3 x0^2"; }

 private:
  int64_t batch_;
  uint64_t seed_;
};

struct Args {
  std::string cluster, save;
  int64_t steps = 300;
};

bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return false;
    if (arg == "--cluster") {
      a.cluster = argv[++i];
    } else if (arg == "--save") {
      a.save = argv[++i];
    } else if (arg == "--steps") {
      a.steps = std::atoll(argv[++i]);
      if (a.steps < 1) return false;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse(argc, argv, args)) {
    std::fprintf(stderr, "usage: custom_model [--cluster FILE] [--steps N] [--save FILE]\n");
    return 2;
  }
  hap::train::TrainConfig config;
  config.batch_size = 64;
  config.steps = args.steps;
  config.optimizer = hap::train::Optimizer::kAdamW;
  config.lr = 1e-2;
  config.min_lr = 1e-3;
  config.warmup_steps = 10;
  config.weight_decay = 1e-4;
  config.beta2 = 0.999;
  config.grad_clip = 1.0;
  config.seed = 2024;
  config.log_every = 10;
  config.eval_every = args.steps;
  config.eval_batches = 2;

  auto model = std::make_shared<Regressor>(/*width=*/32, /*depth=*/2, config.seed);
  auto data = std::make_shared<Waves>(config.batch_size, config.seed);
  hap::train::FitOptions fit;
  fit.checkpoint_path = args.save;

  hap::train::TrainSummary summary;
  bool lead = true;
  if (args.cluster.empty()) {
    hap::train::Trainer trainer(model, data, config);
    summary = trainer.fit(fit);
  } else {
    hap::parallel::MpiSession mpi(&argc, &argv);
    hap::parallel::Communicator world = hap::parallel::Communicator::world();
    lead = world.rank() == 0;
    hap::parallel::run_or_abort_all(world, [&] {
      hap::train::DistributedOptions dist{hap::train::load_cluster_config(args.cluster), {}, ""};
      hap::train::Trainer trainer(model, data, config, world, dist);
      if (lead)
        std::printf("%s\n",
                    hap::train::plan_report(*trainer.cost_model(), *trainer.program(), {}).c_str());
      summary = trainer.fit(fit);
    });
  }
  const bool converged = summary.last_loss < 0.1 * summary.first_loss;
  if (lead)
    std::printf("custom_model: %s: %s\n", hap::train::summary_text(summary).c_str(),
                converged ? "ok" : "did not converge");
  return converged ? 0 : 1;
}
