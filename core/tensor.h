// Tensor: a strided view (shape, strides, offset) of a reference-counted storage, with an
// element type and a device. Copies of a Tensor share the same impl (handle semantics, as in
// libtorch). Differentiable operations are free functions in ops/functional.h; the methods here
// only read metadata or build raw, non-differentiable views.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace hap {

namespace autograd {
struct Node;
}

class Allocator;

// Memory on one device, from that device type's allocator (core/allocator.h).
struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  Allocator* allocator = nullptr;
  // `pinned`: on the CPU, from the pinned host allocator where one is registered.
  Storage(size_t nbytes, Device device, bool pinned = false);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

class Tensor;
struct TensorImpl;

// Autograd state of a tensor: set on leaves that require grad and on op outputs that need one.
struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;                   // which output of grad_fn this tensor is
  // Set by autograd::rematerializable: the nodes that save this tensor for their backward keep
  // this instead, and call it when their backward runs (it makes the same values again).
  std::shared_ptr<const std::function<Tensor()>> remake;
  // Set under bf16 mixed precision on a view of a leaf (a slice or reshape of a parameter, made
  // by view ops only): makes the same view of the leaf again, detached. A bf16 copy of such a
  // view is then cast again for backward rather than kept, as a leaf's copy is.
  std::shared_ptr<const std::function<Tensor()>> view_source;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;  // null for shape-only (traced) tensors
  Shape shape;
  Strides strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::F32;
  Device device;
  std::unique_ptr<AutogradMeta> autograd;
};

struct TensorOptions {
  DType dtype = DType::F32;
  Device device = Device::cpu();
  bool requires_grad = false;
  // Host memory page-locked for fast copies to and from a GPU (core/allocator.h,
  // register_pinned_host_allocator); ordinary host memory where no backend provides it, and
  // ignored off the CPU.
  bool pinned = false;
  TensorOptions& with_dtype(DType d) {
    dtype = d;
    return *this;
  }
  TensorOptions& with_device(Device d) {
    device = d;
    return *this;
  }
  TensorOptions& with_requires_grad(bool r) {
    requires_grad = r;
    return *this;
  }
  TensorOptions& with_pinned(bool p) {
    pinned = p;
    return *this;
  }
};

// While a MetaGuard is alive on this thread, Tensor::empty (and the factories built on it) make
// shape-only tensors with no storage, and fills skip them: a model can be built and traced at any
// size without allocating or initialising its parameters.
class MetaGuard {
 public:
  MetaGuard();
  ~MetaGuard();
  MetaGuard(const MetaGuard&) = delete;
  MetaGuard& operator=(const MetaGuard&) = delete;
  static bool active();

 private:
  bool prev_;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories ----
  static Tensor empty(const Shape& shape, TensorOptions opt = {});
  static Tensor zeros(const Shape& shape, TensorOptions opt = {});
  static Tensor ones(const Shape& shape, TensorOptions opt = {});
  static Tensor full(const Shape& shape, double value, TensorOptions opt = {});
  static Tensor scalar(double value, TensorOptions opt = {});
  static Tensor arange(int64_t n, TensorOptions opt = {});
  // Copies `values` (converted to opt.dtype) into a new tensor of the given shape.
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape,
                            TensorOptions opt = {});
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                            TensorOptions opt = {});
  static Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape,
                            TensorOptions opt = {.dtype = DType::I64});
  // A tensor with metadata only (no storage), used by tracing.
  static Tensor meta(const Shape& shape, DType dtype, Device device = Device::cpu());

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Strides& strides() const { return impl_->strides; }
  int64_t offset() const { return impl_->offset; }
  int64_t dim() const { return static_cast<int64_t>(impl_->shape.size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const { return shape_numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->device; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  bool has_storage() const { return impl_ && impl_->storage != nullptr; }
  std::string str() const;  // "f32[2, 3] cpu"

  // ---- data ----
  // Pointer to element 0 of this view, in the memory of the tensor's device (a kernel's view).
  void* raw_data() const;
  // Typed host access: the tensor must be on the CPU (to(Device::cpu()) copies one that is not).
  template <typename T>
  T* data() const {
    HAP_CHECK(dtype_of<T>::value == dtype(), "data<", dtype_name(dtype_of<T>::value),
              ">() called on a tensor of dtype ", dtype_name(dtype()));
    HAP_CHECK(device().is_cpu(), "data<", dtype_name(dtype_of<T>::value),
              ">() reads host memory, but ", str(), " is on ", device().str(),
              "; copy it with to(Device::cpu()) first");
    return static_cast<T*>(raw_data());
  }
  // Element at a flat (row-major logical) index, converted to double (read through the host
  // for a device tensor). Slow; for tests, losses and I/O.
  double item_at(int64_t flat_index) const;
  double item() const;
  std::vector<double> to_vector() const;  // logical row-major order
  std::vector<float> to_float_vector() const;

  // ---- raw views and copies (not differentiable) ----
  Tensor as_strided(const Shape& shape, const Strides& strides, int64_t offset) const;
  Tensor contiguous() const;  // this if already contiguous, else a packed copy
  Tensor clone() const;       // always a packed copy, no autograd history
  Tensor to(DType dtype) const;
  // The same values on `device`: this tensor when it is there already, else a contiguous copy
  // through the device backend's copies (core/allocator.h).
  Tensor to(Device device) const;
  Tensor detach() const;                    // same storage, no autograd history
  void copy_from(const Tensor& src) const;  // same shape; converts dtype
  void fill_(double value) const;
  void zero_() const { fill_(0.0); }

  // ---- autograd ----
  bool requires_grad() const { return impl_->autograd && impl_->autograd->requires_grad; }
  Tensor& set_requires_grad(bool r);
  Tensor grad() const;  // undefined Tensor if none yet
  void set_grad(const Tensor& g) const;
  void zero_grad() const;
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  bool is_leaf() const { return !impl_->autograd || !impl_->autograd->grad_fn; }
  // Reverse-mode differentiation from this scalar (or with an explicit gradient).
  void backward(const Tensor& grad_output = Tensor()) const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// What the tensor methods above do elementwise on a device tensor (fill_, clone and contiguous of
// a view, to(dtype), copy_from between views on one device), registered by the device's backend
// beside its allocator (core/allocator.h). Without one, those calls are an error naming the
// device; copies to and from the host need only the backend's byte copies.
struct DeviceTensorOps {
  // Sets every element of the view `t` to `value` converted to its dtype (as on the host).
  void (*fill)(const Tensor& t, double value) = nullptr;
  // dst = src elementwise: views of one shape on one device, converting the dtype as the host
  // does (bf16 rounded to nearest even, from f64 through round-to-odd f32).
  void (*copy)(const Tensor& dst, const Tensor& src) = nullptr;
};
void register_device_tensor_ops(DeviceKind kind, const DeviceTensorOps& ops);
// What is registered for `kind` now (members null: nothing).
DeviceTensorOps registered_device_tensor_ops(DeviceKind kind);

}  // namespace hap
