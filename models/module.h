// Module: the base of every layer and model, shaped like the libtorch C++ frontend. A module owns
// named parameters and named submodules; full parameter names are dotted paths through the tree
// ("blocks.0.attn.qkv.weight"), in registration order.
//
//   struct Regressor : hap::nn::Module {
//     std::shared_ptr<hap::nn::Linear> fc1, fc2;
//     Regressor() : Module("Regressor") {
//       fc1 = register_module("fc1", std::make_shared<hap::nn::Linear>(hap::nn::LinearOptions(1,
//       64))); fc2 = register_module("fc2",
//       std::make_shared<hap::nn::Linear>(hap::nn::LinearOptions(64, 1)));
//     }
//     hap::Tensor forward(const hap::Tensor& x) { return fc2->forward(hap::relu(fc1->forward(x)));
//     }
//   };
//   auto model = std::make_shared<Regressor>();
//   model->reset_parameters(/*seed=*/1234);  // full names are known once the tree is built
//
// Randomness. Initialisation: see models/init.h (stream = FNV-1a of the full name). Dropout: a
// model's modules share one RandomState, bound by set_random_seed(seed) on the root; module i (its
// position in named_modules()) draws its masks with
//     seed = the model seed, stream = step * kRandomStreamsPerStep + i,
// where `step` is the model's counter, advanced once per training forward by the model (GPT does
// this itself; a custom model calls advance_random_step()). Masks therefore differ per layer and
// per step, and are reproducible from (seed, step). A module never bound to a model has a private
// state (seed 0, index 0) that advances after each draw.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "models/init.h"
#include "ops/dispatch.h"

// A field of an options struct in the libtorch style: `LinearOptions(8, 4).bias(false)` sets it
// (and returns the options for chaining), `options.bias()` reads it.
#define HAP_ARG(T, name)                                   \
 public:                                                   \
  auto name(const T& new_##name)->decltype(*this) {        \
    this->name##_ = new_##name;                            \
    return *this;                                          \
  }                                                        \
  const T& name() const noexcept { return this->name##_; } \
                                                           \
 private:                                                  \
  T name##_

namespace hap::nn {

// The dropout random state shared by the modules of one model (see the file comment).
struct RandomState {
  uint64_t seed = 0;
  uint64_t step = 0;
  bool auto_advance = true;  // true for a module's private state: advance after each draw
};

// Streams reserved per step: a model may have at most this many modules.
inline constexpr uint64_t kRandomStreamsPerStep = uint64_t{1} << 20;

// The generator coordinates of one random draw.
struct RandomDraw {
  uint64_t seed = 0;
  uint64_t stream = 0;
};

class Module {
 public:
  explicit Module(std::string type_name = "Module");
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The class name used in messages ("Linear", "GPT").
  const std::string& type_name() const { return type_name_; }
  // The full dotted name of this module in the tree it was first registered in ("blocks.3.attn";
  // "" for a root). Ops a layer runs inside enter_scope() are traced with this module path, which
  // names them in graphs, plans and errors and groups them into segments (one per numbered
  // child of a module list, e.g. each transformer block).
  const std::string& path() const { return path_; }

  // ---- registration ----
  // Registers `tensor` (a leaf) under `name` and sets its requires_grad. Returns the same tensor
  // (handles share storage, so the caller may keep it as a member). The name must be non-empty,
  // contain no '.', and be unique among this module's parameters and submodules.
  Tensor register_parameter(std::string name, Tensor tensor, bool requires_grad = true);

  // Registers `tensor` as the buffer `name` (same name rules): state the module keeps but does
  // not train, such as BatchNorm's running statistics. Buffers are saved in checkpoints beside
  // the parameters, converted by to(), reset by reset_parameters() (by init_rule, as parameters),
  // and on ranks every rank holds all of each (the executor updates them after training
  // forwards). Returns the same tensor.
  Tensor register_buffer(std::string name, Tensor tensor);

  // Registers `module` as the submodule `name` (same name rules) and returns it.
  template <typename M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    static_assert(std::is_base_of_v<Module, M>, "register_module: M must derive from nn::Module");
    add_child(std::move(name), module);
    return module;
  }

  // ---- the tree ----
  // Every parameter under its full dotted name: this module's own parameters first, then each
  // submodule's (recursively), in registration order. A tensor registered more than once (tied
  // parameters, a shared submodule) is listed once, under its first name.
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  // This module (name "") and every submodule under its full dotted name, in pre-order; a module
  // reachable twice is listed once. The pointers are owned by the tree.
  std::vector<std::pair<std::string, Module*>> named_modules() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // The parameter with this full name; throws naming the module when there is none.
  Tensor parameter(const std::string& full_name) const;
  // Every buffer under its full dotted name, ordered as named_parameters().
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  // The buffer with this full name; throws naming the module when there is none.
  Tensor buffer(const std::string& full_name) const;
  // Total number of elements over named_parameters().
  int64_t num_parameters() const;

  // ---- modes and housekeeping (recursive) ----
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Drops every parameter's gradient (the next backward() sets a fresh one).
  void zero_grad();
  // Converts every floating-point parameter to `dtype` in place: the tensors keep their identity
  // (members and optimizer references stay valid), their gradients are dropped.
  void to(DType dtype);
  // Moves every parameter and buffer to `device` in place, as to(DType) does (identities kept,
  // gradients dropped).
  void to(Device device);

  // ---- initialisation ----
  // Redraws every parameter (and buffer) with the rule init_rule_of(name) gives it (see
  // models/init.h).
  void reset_parameters(uint64_t seed);
  // The seed of the last reset_parameters() on this module (nullopt if never): with it and the
  // init rules, a rank draws exactly its shard of every parameter (train::Trainer on ranks).
  std::optional<uint64_t> init_seed() const { return init_seed_; }
  // The rule for the parameter (or buffer) `full_name`: the outermost module on its path whose
  // init_rule() answers decides (so a model can override its layers' defaults); no answer means
  // keep.
  ParamInit init_rule_of(const std::string& full_name) const;
  // This module's rule for the parameter `name` (relative to this module, e.g. "weight" or
  // "blocks.0.attn.proj.weight"), or nullopt to let the modules below decide.
  virtual std::optional<ParamInit> init_rule(const std::string& name, const Tensor& param) const;

  // ---- dropout randomness (see the file comment) ----
  // Binds a fresh RandomState (this seed, step 0) to this module and every module below it, and
  // numbers them in named_modules() order. Call it on the root once the tree is built.
  void set_random_seed(uint64_t seed);
  uint64_t random_seed() const { return random_->seed; }
  uint64_t random_step() const { return random_->step; }
  void set_random_step(uint64_t step) { random_->step = step; }
  void advance_random_step() { ++random_->step; }
  uint64_t module_index() const { return module_index_; }

 protected:
  // The (seed, stream) for this module's next draw.
  RandomDraw next_random_draw();
  // Scopes the ops run until the guard ends to this module's path (every built-in layer's forward
  // does this; a custom module may, or leave its own ops to the tracer, which attributes an
  // unscoped op to the block its inputs come from).
  ops::ScopeGuard enter_scope() const { return ops::ScopeGuard(path_, ops::ScopeGuard::kAbsolute); }

 private:
  void check_new_name(const std::string& name, const char* what) const;
  // named_parameters() or named_buffers().
  std::vector<std::pair<std::string, Tensor>> named_tensors(
      std::vector<std::pair<std::string, Tensor>> Module::*list, bool recurse) const;
  void add_child(std::string name, std::shared_ptr<Module> child);
  // Sets the path of this module and of the submodules it registered first, recursively.
  void set_path(const std::string& path);

  std::string type_name_;
  std::string path_;
  const Module* parent_ = nullptr;  // the module this one was first registered in
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::shared_ptr<RandomState> random_;
  uint64_t module_index_ = 0;
  std::optional<uint64_t> init_seed_;
};

// A list of submodules named "0", "1", ... (GPT's "blocks").
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return items_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  // The i-th module as an M; throws if it is another type.
  template <typename M>
  std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    HAP_CHECK(m != nullptr, "ModuleList: module ", i, " is a ", (*this)[i]->type_name(),
              ", not the requested type");
    return m;
  }

 private:
  std::vector<std::shared_ptr<Module>> items_;
};

}  // namespace hap::nn
