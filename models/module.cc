#include "models/module.h"

#include <unordered_set>

#include "autograd/grad_mode.h"

namespace hap::nn {

namespace {

// "prefix.name", or "name" at the root.
std::string join_name(const std::string& prefix, const std::string& name) {
  if (prefix.empty()) return name;
  std::string out;
  out.reserve(prefix.size() + 1 + name.size());
  out.append(prefix).append(1, '.').append(name);
  return out;
}

}  // namespace

Module::Module(std::string type_name)
    : type_name_(std::move(type_name)), random_(std::make_shared<RandomState>()) {}

void Module::check_new_name(const std::string& name, const char* what) const {
  HAP_CHECK(!name.empty(), what, " name must not be empty (in ", type_name_, ")");
  HAP_CHECK(name.find('.') == std::string::npos, what, " name must not contain a dot (got '", name,
            "')");
  for (const auto& [n, _] : params_)
    HAP_CHECK(n != name, what, " name '", name, "' is already used by a parameter of ", type_name_);
  for (const auto& [n, _] : buffers_)
    HAP_CHECK(n != name, what, " name '", name, "' is already used by a buffer of ", type_name_);
  for (const auto& [n, _] : children_)
    HAP_CHECK(n != name, what, " name '", name, "' is already used by a submodule of ", type_name_);
}

Tensor Module::register_parameter(std::string name, Tensor tensor, bool requires_grad) {
  check_new_name(name, "Parameter");
  HAP_CHECK(tensor.defined(), "Parameter '", name, "' of ", type_name_, " is an undefined tensor");
  HAP_CHECK(tensor.is_leaf(), "Parameter '", name, "' of ", type_name_,
            " must be a leaf tensor, got one with autograd history; register t.detach()");
  HAP_CHECK(!requires_grad || is_floating(tensor.dtype()), "Parameter '", name, "' of ", type_name_,
            " requires grad but has dtype ", dtype_name(tensor.dtype()),
            "; only floating-point parameters can require grad");
  tensor.set_requires_grad(requires_grad);
  params_.emplace_back(std::move(name), tensor);
  return tensor;
}

Tensor Module::register_buffer(std::string name, Tensor tensor) {
  check_new_name(name, "Buffer");
  HAP_CHECK(tensor.defined(), "Buffer '", name, "' of ", type_name_, " is an undefined tensor");
  HAP_CHECK(!tensor.requires_grad() && tensor.is_leaf(), "Buffer '", name, "' of ", type_name_,
            " must be a leaf that does not require grad (a trained tensor is a parameter)");
  buffers_.emplace_back(std::move(name), tensor);
  return tensor;
}

void Module::add_child(std::string name, std::shared_ptr<Module> child) {
  check_new_name(name, "Submodule");
  HAP_CHECK(child != nullptr, "Submodule '", name, "' of ", type_name_, " is null");
  HAP_CHECK(child.get() != this, "Submodule '", name, "': a module cannot contain itself");
  for (const auto& [_, m] : child->named_modules())
    HAP_CHECK(m != this, "Submodule '", name, "' of ", type_name_,
              " contains this module: module trees must not have cycles");
  // A module registered a second time (a shared submodule) keeps its first name, as in
  // named_modules().
  if (child->parent_ == nullptr) {
    child->parent_ = this;
    child->set_path(join_name(path_, name));
  }
  children_.emplace_back(std::move(name), std::move(child));
}

void Module::set_path(const std::string& path) {
  path_ = path;
  for (const auto& [n, c] : children_)
    if (c->parent_ == this) c->set_path(join_name(path_, n));
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() const {
  std::vector<std::pair<std::string, Module*>> out;
  std::unordered_set<const Module*> seen;
  // Pre-order walk with explicit prefixes.
  struct Walker {
    std::vector<std::pair<std::string, Module*>>& out;
    std::unordered_set<const Module*>& seen;
    void visit(const std::string& prefix, const Module* m) {
      if (!seen.insert(m).second) return;
      out.emplace_back(prefix, const_cast<Module*>(m));
      for (const auto& [n, c] : m->children_) visit(join_name(prefix, n), c.get());
    }
  };
  Walker{out, seen}.visit("", this);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  return children_;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  return named_tensors(&Module::params_, recurse);
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  return named_tensors(&Module::buffers_, recurse);
}

std::vector<std::pair<std::string, Tensor>> Module::named_tensors(
    std::vector<std::pair<std::string, Tensor>> Module::*list, bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const TensorImpl*> seen;
  auto add_own = [&](const std::string& prefix, const Module* m) {
    for (const auto& [n, t] : m->*list)
      if (seen.insert(t.impl()).second) out.emplace_back(join_name(prefix, n), t);
  };
  if (!recurse) {
    add_own("", this);
    return out;
  }
  for (const auto& [prefix, m] : named_modules()) add_own(prefix, m);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [_, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

Tensor Module::parameter(const std::string& full_name) const {
  auto named = named_parameters();
  for (const auto& [n, t] : named)
    if (n == full_name) return t;
  std::string some;
  for (size_t i = 0; i < named.size() && i < 4; ++i) some += (i ? ", " : "") + named[i].first;
  if (named.size() > 4) some += ", ...";
  HAP_CHECK(false, type_name_, " has no parameter named '", full_name, "' (it has ", named.size(),
            ": ", some, ")");
  return Tensor();
}

Tensor Module::buffer(const std::string& full_name) const {
  const auto named = named_buffers();
  for (const auto& [n, t] : named)
    if (n == full_name) return t;
  HAP_CHECK(false, type_name_, " has no buffer named '", full_name, "' (it has ", named.size(),
            named.empty() ? "" : ", e.g. '" + named[0].first + "'", ")");
  return Tensor();
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [_, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  for (auto& [_, m] : named_modules()) m->training_ = on;
}

void Module::zero_grad() {
  for (auto& [_, t] : named_parameters()) t.zero_grad();
}

void Module::to(DType dtype) {
  HAP_CHECK(is_floating(dtype), type_name_, ".to(", dtype_name(dtype),
            "): parameters can only be converted to a floating-point dtype");
  auto tensors = named_parameters();
  for (auto& b : named_buffers()) tensors.push_back(b);
  for (auto& [name, t] : tensors) {
    if (!is_floating(t.dtype()) || t.dtype() == dtype) continue;
    Tensor converted = t.to(dtype);
    // Swap the data under the existing impl, so every handle to the parameter sees the new dtype.
    TensorImpl* impl = t.impl();
    impl->storage = converted.impl()->storage;
    impl->strides = converted.strides();
    impl->offset = converted.offset();
    impl->dtype = dtype;
    t.zero_grad();
  }
}

void Module::to(Device device) {
  auto tensors = named_parameters();
  for (auto& b : named_buffers()) tensors.push_back(b);
  for (auto& [name, t] : tensors) {
    if (t.device() == device || !t.has_storage()) continue;
    Tensor moved = t.to(device);
    TensorImpl* impl = t.impl();
    impl->storage = moved.impl()->storage;
    impl->strides = moved.strides();
    impl->offset = moved.offset();
    impl->device = device;
    t.zero_grad();
  }
}

std::optional<ParamInit> Module::init_rule(const std::string&, const Tensor&) const {
  return std::nullopt;
}

ParamInit Module::init_rule_of(const std::string& full_name) const {
  // Find the parameter along its dotted path (not by listing every parameter: called once per
  // parameter, that would make initialising a deep model quadratic).
  Tensor param;
  {
    const Module* owner = this;
    std::string rel = full_name;
    for (size_t dot; owner && (dot = rel.find('.')) != std::string::npos;
         rel = rel.substr(dot + 1)) {
      const Module* next = nullptr;
      for (const auto& [n, c] : owner->children_)
        if (n == rel.substr(0, dot)) next = c.get();
      owner = next;
    }
    if (owner)
      for (const auto* list : {&owner->params_, &owner->buffers_})
        for (const auto& [n, t] : *list)
          if (n == rel) param = t;
    if (!param.defined()) param = parameter(full_name);  // not on its path: the usual error
  }
  const Module* m = this;
  std::string rel = full_name;
  while (true) {
    if (auto rule = m->init_rule(rel, param)) return *rule;
    size_t dot = rel.find('.');
    if (dot == std::string::npos) return ParamInit::keep();
    std::string child = rel.substr(0, dot);
    const Module* next = nullptr;
    for (const auto& [n, c] : m->children_)
      if (n == child) next = c.get();
    HAP_ASSERT(next != nullptr, "parameter path '", full_name, "' has no submodule '", child, "'");
    m = next;
    rel = rel.substr(dot + 1);
  }
}

void Module::reset_parameters(uint64_t seed) {
  init_seed_ = seed;
  NoGradGuard no_grad;
  for (const auto& [name, t] : named_parameters())
    init_parameter(t, init_rule_of(name), seed, name);
  for (const auto& [name, t] : named_buffers())
    if (t.has_storage()) init_parameter(t, init_rule_of(name), seed, name);
}

void Module::set_random_seed(uint64_t seed) {
  auto state = std::make_shared<RandomState>();
  state->seed = seed;
  state->auto_advance = false;
  auto modules = named_modules();
  HAP_CHECK(modules.size() <= kRandomStreamsPerStep, type_name_, " has ", modules.size(),
            " modules; dropout streams allow at most ", kRandomStreamsPerStep);
  for (size_t i = 0; i < modules.size(); ++i) {
    modules[i].second->random_ = state;
    modules[i].second->module_index_ = i;
  }
}

RandomDraw Module::next_random_draw() {
  RandomDraw d{random_->seed, random_->step * kRandomStreamsPerStep + module_index_};
  if (random_->auto_advance) ++random_->step;
  return d;
}

void ModuleList::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(items_.size()), module);
  items_.push_back(std::move(module));
}

const std::shared_ptr<Module>& ModuleList::operator[](size_t i) const {
  HAP_CHECK(i < items_.size(), "ModuleList: index ", i, " out of range for ", items_.size(),
            " modules");
  return items_[i];
}

}  // namespace hap::nn
