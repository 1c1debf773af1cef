// The engine on MPI ranks: trace the model, synthesize (or load) the program, check that every
// rank runs the same one, and run it with the SPMD executor.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <tuple>

#include "autograd/grad_mode.h"
#ifdef HAP_HAVE_CUDA
#include "core/cuda/backend.h"
#include "core/cuda/green_context.h"
#endif
#include "models/init.h"
#include "models/module.h"
#include "ops/dispatch.h"
#include "ops/threads.h"
#include "parallel/collectives.h"
#include "parallel/executor.h"
#include "parallel/nccl.h"
#include "parallel/shard.h"
#include "parallel/staging.h"
#include "train/engine.h"
#include "train/plan_io.h"
#include "train/trace.h"

namespace hap::train {

namespace {

class SpmdEngine : public Engine {
 public:
  SpmdEngine(std::shared_ptr<nn::Model> model, std::shared_ptr<Dataset> data,
             const TrainConfig& config, parallel::Communicator comm, DistributedOptions dist)
      : model_(std::move(model)),
        data_(std::move(data)),
        config_(config),
        comm_(std::move(comm)),
        cluster_(std::move(dist.cluster)),
        inputs_(model_->inputs(config.batch_size)),
        graph_(trace_model(*model_, config.batch_size, config.precision)) {
    // The program may leave devices out: its cost model (and a plan file's fingerprint) is that
    // of the devices it runs on.
    std::vector<int> devices;
    if (dist.plan_file.empty()) {
      plan_ = synth::synthesize(graph_, cluster_, dist.synthesis);
      devices = plan_.devices;
    } else {
      devices = plan_devices(dist.plan_file, cluster_);
    }
    plan_cluster_ = devices.empty() ? cluster_ : cluster_.subset(devices);
    cost_ = std::make_unique<synth::CostModel>(graph_, plan_cluster_,
                                               dist.synthesis.optimizer_state_slots,
                                               dist.synthesis.overlap_grad_comm);
    cost_->set_hierarchical(dist.synthesis.hierarchical_collectives);
    if (!dist.plan_file.empty()) {
      plan_ = load_plan(dist.plan_file, *cost_);
      plan_.devices = devices;
      if (!devices.empty())
        plan_.devices_note =
            "runs on the " + std::to_string(devices.size()) + " devices the plan file names";
    }
    cost_->set_recompute(plan_.node_segment, plan_.recompute);
    // Every rank planned from the same inputs; a difference (non-deterministic planning, another
    // file on another node) would deadlock or corrupt the collectives: stop every rank instead.
    const uint64_t hash = synth::program_hash(plan_);
    std::vector<uint8_t> lead_hash(sizeof hash);
    std::memcpy(lead_hash.data(), &hash, sizeof hash);
    comm_.broadcast_bytes(lead_hash, 0);
    uint64_t rank0 = 0;
    std::memcpy(&rank0, lead_hash.data(), sizeof rank0);
    HAP_CHECK(
        comm_.allreduce(int64_t{rank0 != hash}) == 0,
        "the ranks run different programs (program hash of rank 0 differs from another rank's: "
        "non-deterministic planning, or different plan or cluster files on different nodes)");
    if (!plan_.devices.empty()) {
      // The ranks the program runs on form its communicator (in rank order); the others wait.
      const auto it = std::find(plan_.devices.begin(), plan_.devices.end(), comm_.rank());
      const int position =
          it == plan_.devices.end() ? -1 : static_cast<int>(it - plan_.devices.begin());
      world_ = comm_;
      comm_ = world_.split(position < 0 ? -1 : 0, position);
      if (position < 0) return;
    }
    parallel::ExecutorOptions exec;
    exec.overlap_grad_comm = dist.synthesis.overlap_grad_comm;
    executor_ = std::make_unique<parallel::Executor>(graph_, plan_, comm_, exec);
    materialize();
  }

  const std::vector<std::pair<std::string, Tensor>>& parameters() const override {
    static const std::vector<std::pair<std::string, Tensor>> none;
    return executor_ ? executor_->parameters() : none;
  }
  const std::vector<std::pair<std::string, Tensor>>& buffers() const override {
    static const std::vector<std::pair<std::string, Tensor>> none;
    return executor_ ? executor_->states() : none;
  }

  bool left_out() const override { return !comm_.valid(); }
  // Every rank of the world meets once in a barrier: the left-out ones at the start, waiting
  // without a timeout and without spinning (they have nothing else to do), the others when they
  // are done.
  void wait_for_the_others() override {
    if (!left_out() || finished_) return;
    finished_ = true;
    const double timeout = parallel::collective_timeout();
    const parallel::WaitPolicy policy = parallel::wait_policy();
    parallel::set_collective_timeout(0);
    parallel::set_wait_policy(parallel::WaitPolicy::Sleep);
    world_.barrier();
    parallel::set_wait_policy(policy);
    parallel::set_collective_timeout(timeout);
  }
  void finish() override {
    if (left_out() || finished_ || !world_.valid()) return;
    finished_ = true;
    world_.barrier();
  }

  double forward(uint64_t step, uint64_t random_seed) override {
    loss_ = executor_->forward(
        source(Split::kTrain, step),
        {.random_offset = step * nn::kRandomStreamsPerStep, .random_seed = random_seed});
    return executor_->global_loss(loss_);
  }

  void backward() override {
    executor_->backward(loss_);
    loss_ = Tensor();
  }

  double grad_norm() const override { return executor_->global_grad_norm(); }
  void update(optim::Optimizer& optimizer, double grad_scale) override {
    executor_->update(
        [&](const std::vector<Tensor>& params) { optimizer.step(params, grad_scale); });
  }

  double eval_loss(uint64_t index, uint64_t random_seed) override {
    NoGradGuard no_grad;
    return executor_->global_loss(executor_->forward(
        source(Split::kVal, index), {.random_seed = random_seed, .training = false}));
  }

  Tensor logical(const std::string& name, const Tensor& local) const override {
    return executor_->gathered_like(name, local);
  }

  Tensor local_part(const std::string& name, const Tensor& full,
                    const Shape& local_shape) const override {
    return parallel::box_of(full, local_shape, executor_->slice_of(name));
  }

  bool lead() const override { return !left_out() && comm_.rank() == 0; }
  int rank() const override { return left_out() ? world_.rank() : comm_.rank(); }
  int world_size() const override { return left_out() ? 0 : comm_.size(); }
  double max_over_ranks(double value) const override {
    return comm_.allreduce(value, parallel::ReduceOp::Max);
  }
  void barrier() const override { comm_.barrier(); }
  std::vector<std::string> gather_strings(const std::string& s) const override {
    std::vector<std::string> all(static_cast<size_t>(comm_.size()));
    for (int r = 0; r < comm_.size(); ++r)
      all[static_cast<size_t>(r)] = comm_.broadcast_string(comm_.rank() == r ? s : "", r);
    return all;
  }
  std::string track_name() const override {
    return "rank " + std::to_string(comm_.rank()) + ": " +
           plan_cluster_.devices[static_cast<size_t>(comm_.rank())].name;
  }

  void start_profile() override {
    ops::reset_dispatch_stats();
    ops::set_profiling(true);
    parallel::reset_collective_stats();
  }

  // Rank 0 prints, per rank, the milliseconds per step spent in op kernels and in each collective.
  void print_profile(double seconds, int64_t steps) override {
    ops::set_profiling(false);
    if (steps == 0) return;
    const double per_step = static_cast<double>(steps);
    double kernels = 0;
    for (double s : ops::dispatch_stats().kernel_s) kernels += s;
    const parallel::CollectiveStats& cs = parallel::collective_stats();
    std::vector<std::vector<double>> cols = {comm_.allgather(kernels / per_step)};
    std::vector<std::vector<double>> calls;
    for (int k = 0; k < parallel::kNumCollectiveStats; ++k) {
      cols.push_back(comm_.allgather(cs.seconds[k] / per_step));
      calls.push_back(comm_.allgather(static_cast<double>(cs.calls[k]) / per_step));
    }
    if (!lead()) return;
    std::printf(
        "profile: ms per training step over %ld steps (slowest rank's step: %.1f ms); calls per "
        "step\n",
        static_cast<long>(steps), seconds / per_step * 1e3);
    std::printf("  rank   kernels");
    for (int k = 0; k < parallel::kNumCollectiveStats; ++k)
      std::printf(" %22s",
                  parallel::collective_stat_name(static_cast<parallel::CollectiveStat>(k)));
    std::printf("      rest\n");
    for (int r = 0; r < comm_.size(); ++r) {
      double rest = seconds / per_step;
      std::printf("  %4d %9.1f", r, cols[0][r] * 1e3);
      rest -= cols[0][r];
      for (int k = 0; k < parallel::kNumCollectiveStats; ++k) {
        std::printf(" %12.1f (%6.1f x)", cols[k + 1][r] * 1e3, calls[k][r]);
        rest -= cols[k + 1][r];
      }
      std::printf(" %9.1f\n", rest * 1e3);
    }
    std::fflush(stdout);
  }

  std::string placement() const override {
    std::string green;
#ifdef HAP_HAVE_CUDA
    if (!config_.device.is_cpu() && cuda::green_context().device >= 0)
      green = " " + cuda::green_context_note();
#endif
    const std::string on =
        config_.device.is_cpu() ? "cpu" : "cuda (rank 0 on " + config_.device.str() + green + ")";
    std::string left;
    if (world_.valid())
      left = " (" + std::to_string(world_.size() - comm_.size()) + " of the " +
             std::to_string(world_.size()) + " launched left out by the plan)";
    return std::to_string(comm_.size()) + " ranks on " + on + ", their collectives over " +
           comm_.backend().name() + left;
  }

  const synth::DistributedProgram* program() const override { return &plan_; }
  const synth::CostModel* cost_model() const override { return cost_.get(); }

 private:
  // This rank's parameters: slices of the model's values where it has them, else drawn shard by
  // shard from the init rules (exactly the slices of the one-process initialisation).
  void materialize() {
    std::map<std::string, Tensor> values;
    for (const auto& [name, p] : model_->named_parameters()) values[name] = p;
    const std::optional<uint64_t> seed = model_->init_seed();
    executor_->materialize_parameters(
        [&](const std::string& name, const Shape& local, const LogicalSlice& slice) {
          const Tensor& full = values.at(name);
          if (full.has_storage())
            return parallel::box_of(full, local, slice).contiguous().clone().to(config_.device);
          const nn::ParamInit rule = model_->init_rule_of(name);
          HAP_CHECK(seed.has_value() && rule.kind != nn::ParamInit::Kind::Keep, "parameter '", name,
                    "' has no data and no init rule to draw it from (build the model with data, or "
                    "give it an "
                    "init_rule() and reset_parameters(seed))");
          Tensor p = Tensor::empty(local, TensorOptions{}.with_dtype(full.dtype()));
          nn::init_parameter(p, rule, *seed, name, slice);  // drawn on the host
          return p.to(config_.device);
        });
    // Buffers are whole on every rank: the model's own where it has their data (so that they
    // stay one with the model; a copy on a GPU), else made from their init rules (zeros, ones).
    std::vector<std::pair<std::string, Tensor>> buffers;
    for (const auto& [name, b] : model_->named_buffers()) {
      if (b.has_storage()) {
        buffers.emplace_back(name, b.to(config_.device));
        continue;
      }
      const nn::ParamInit rule = model_->init_rule_of(name);
      HAP_CHECK(rule.kind != nn::ParamInit::Kind::Keep, "buffer '", name,
                "' has no data and no init rule to make it from (build the model with data, or "
                "give it an init_rule())");
      Tensor made = Tensor::empty(b.shape(), TensorOptions{}.with_dtype(b.dtype()));
      nn::init_parameter(made, rule, seed.value_or(0), name);
      buffers.emplace_back(name, made.to(config_.device));
    }
    executor_->set_states(buffers);
  }

  // This rank's part of each input of batch `index`: only its rows are read; a split of another
  // dimension is sliced from those rows.
  parallel::TensorSource source(Split split, uint64_t index) {
    cache_.clear();
    return [this, split, index](const std::string& name, const Shape& local,
                                const LogicalSlice& slice) {
      const nn::InputSpec* spec = nullptr;
      for (const nn::InputSpec& s : inputs_)
        if (s.name == name) spec = &s;
      HAP_ASSERT(spec != nullptr, "the graph reads an input '", name,
                 "' the model does not declare");
      const size_t bd = static_cast<size_t>(spec->batch_dim);
      const int64_t row0 = slice.offset.empty() ? 0 : slice.offset[bd];
      const int64_t row1 = row0 + local[bd];
      auto key = std::make_tuple(row0, row1);
      auto it = cache_.find(key);
      if (it == cache_.end()) {
        nn::Batch rows = data_->read(split, index, row0, row1);
        check_batch(rows, inputs_, row0, row1);
        it = cache_.emplace(key, std::move(rows)).first;
      }
      Tensor t = it->second.at(name);
      if (t.shape() == local) return t.to(config_.device);
      LogicalSlice within = slice;  // the rows are already this rank's: slice the other dims
      within.offset[bd] = 0;
      return parallel::box_of(t, local, within).contiguous().to(config_.device);
    };
  }

  std::shared_ptr<nn::Model> model_;
  std::shared_ptr<Dataset> data_;
  TrainConfig config_;
  parallel::Communicator comm_;
  synth::Cluster cluster_;
  std::vector<nn::InputSpec> inputs_;
  synth::Graph graph_;
  synth::Cluster plan_cluster_;  // the devices the program runs on
  std::unique_ptr<synth::CostModel> cost_;
  parallel::Communicator world_;  // every rank, where the program leaves some out
  bool finished_ = false;
  synth::DistributedProgram plan_;
  std::unique_ptr<parallel::Executor> executor_;
  std::map<std::tuple<int64_t, int64_t>, nn::Batch> cache_;  // the rows read for the current batch
  Tensor loss_;
};

}  // namespace

std::string nccl_refusal(bool emulated) {
  if (!emulated) return "";
  return "the ranks of a GPU cluster emulated on one GPU (HAP_EMULATE_SMS, scripts/hap-emulate) "
         "each run in a green context of some of its SMs, and NCCL launches its kernels in the "
         "GPU's primary context, on every SM and unordered with the rank's own kernels; use "
         "parallel.backend=mpi (or auto, which takes it here)";
}

// What carries the collectives of ranks on `device` (parallel.backend): MPI for CPU ranks; for
// GPU ranks NCCL (one GPU per rank), MPI staged through the host (ranks may share a GPU), or auto:
// NCCL where every rank has a GPU of its own and NCCL loads, else staged MPI. Every rank decides
// alike (the inputs of the decision are agreed over `comm`).
parallel::Communicator communicator_for(Device device, CommBackend backend,
                                        parallel::Communicator comm) {
  if (device.is_cpu()) {
    if (backend == CommBackend::kNccl)
      throw ConfigError(
          "parallel.backend: nccl needs GPU ranks (train.device=cuda); CPU ranks "
          "use mpi");
    return comm;
  }
  const std::string refusal = nccl_refusal(gpu_cluster_emulated());
  if (backend == CommBackend::kNccl && !refusal.empty())
    throw ConfigError("parallel.backend: nccl: " + refusal);
  bool nccl = backend == CommBackend::kNccl;
  if (backend == CommBackend::kAuto && !refusal.empty()) {
    nccl = false;
  } else if (backend == CommBackend::kAuto) {
    // Every rank of every node on its own GPU (node-local rank < visible GPUs) and NCCL loads.
    const parallel::Communicator node = comm.split_by_node();
#ifdef HAP_HAVE_CUDA
    const int visible = cuda::device_count();
#else
    const int visible = 0;
#endif
    const bool mine = node.size() <= visible && parallel::nccl_unavailable_reason().empty();
    nccl = comm.allreduce(int64_t{mine ? 0 : 1}) == 0;
  }
  if (nccl)
    return parallel::Communicator(parallel::make_nccl_backend(comm.backend_ptr(), device.index));
  return parallel::Communicator(std::make_shared<parallel::StagingBackend>(comm.backend_ptr()));
}

std::unique_ptr<Engine> make_spmd_engine(std::shared_ptr<nn::Model> model,
                                         std::shared_ptr<Dataset> data, const TrainConfig& config,
                                         parallel::Communicator comm,
                                         DistributedOptions distributed) {
  if (comm.size() != distributed.cluster.size())
    throw ConfigError("the cluster '" + distributed.cluster.name + "' has " +
                      std::to_string(distributed.cluster.size()) + " devices but " +
                      std::to_string(comm.size()) + " ranks were launched (run mpirun -np " +
                      std::to_string(distributed.cluster.size()) + " or srun -n " +
                      std::to_string(distributed.cluster.size()) + ")");
  // Ranks usually share a machine's cores: by default each computes on one thread.
  set_num_threads(config.threads > 0 ? config.threads : 1);
  comm = communicator_for(config.device, distributed.backend, std::move(comm));
  return std::make_unique<SpmdEngine>(std::move(model), std::move(data), config, std::move(comm),
                                      std::move(distributed));
}

}  // namespace hap::train
