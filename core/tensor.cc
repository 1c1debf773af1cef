#include "core/tensor.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <sstream>

#include "core/allocator.h"
#include "core/strided_copy.h"

namespace hap {

Storage::Storage(size_t n, Device d, bool pinned) : nbytes(n), device(d) {
  if (pinned && d.is_cpu()) allocator = pinned_host_allocator();
  try {
    if (allocator == nullptr) allocator = &allocator_for(d.kind);
  } catch (const Error& e) {
    throw Error("allocating " + std::to_string(n) + " bytes on " + d.str() + ": " + e.what());
  }
  data = allocator->allocate(n, d.index);
}

Storage::~Storage() { allocator->deallocate(data, nbytes, device.index); }

namespace {
std::shared_ptr<TensorImpl> make_impl(const Shape& shape, DType dtype, Device device,
                                      bool with_storage, bool pinned = false) {
  int64_t bytes = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t d : shape) {
    HAP_CHECK(d >= 0, "tensor shape ", shape_str(shape), " has a negative dimension");
    // Strides multiply every size (a zero counts as one): none may overflow.
    HAP_CHECK(!__builtin_mul_overflow(bytes, std::max<int64_t>(d, 1), &bytes), "tensor shape ",
              shape_str(shape), " has more elements than 64-bit sizes can count");
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  if (with_storage)
    impl->storage =
        std::make_shared<Storage>(shape_numel(shape) * dtype_size(dtype), device, pinned);
  return impl;
}
}  // namespace

namespace {
thread_local bool t_meta = false;
}  // namespace

MetaGuard::MetaGuard() : prev_(t_meta) { t_meta = true; }
MetaGuard::~MetaGuard() { t_meta = prev_; }
bool MetaGuard::active() { return t_meta; }

Tensor Tensor::empty(const Shape& shape, TensorOptions opt) {
  Tensor t(make_impl(shape, opt.dtype, opt.device, !t_meta, opt.pinned));
  if (opt.requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor Tensor::meta(const Shape& shape, DType dtype, Device device) {
  return Tensor(make_impl(shape, dtype, device, false));
}

Tensor Tensor::zeros(const Shape& shape, TensorOptions opt) { return full(shape, 0.0, opt); }
Tensor Tensor::ones(const Shape& shape, TensorOptions opt) { return full(shape, 1.0, opt); }

Tensor Tensor::full(const Shape& shape, double value, TensorOptions opt) {
  bool rg = opt.requires_grad;
  opt.requires_grad = false;
  Tensor t = empty(shape, opt);
  t.fill_(value);
  if (rg) t.set_requires_grad(true);
  return t;
}

Tensor Tensor::scalar(double value, TensorOptions opt) { return full({}, value, opt); }

Tensor Tensor::arange(int64_t n, TensorOptions opt) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>(i);
  return from_vector(v, {n}, opt);
}

template <typename V>
static Tensor from_values(const std::vector<V>& values, const Shape& shape, TensorOptions opt) {
  HAP_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
            "from_vector: ", values.size(), " values given for shape ", shape_str(shape),
            " (expected ", shape_numel(shape), ")");
  bool rg = opt.requires_grad;
  opt.requires_grad = false;
  Tensor t = Tensor::empty(shape, opt);
  dispatch_all_types(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data<T>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = convert<T>(values[i]);
  });
  if (rg) t.set_requires_grad(true);
  return t;
}

Tensor Tensor::from_vector(const std::vector<double>& v, const Shape& s, TensorOptions o) {
  return from_values(v, s, o);
}
Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& s, TensorOptions o) {
  return from_values(v, s, o);
}
Tensor Tensor::from_vector(const std::vector<int64_t>& v, const Shape& s, TensorOptions o) {
  return from_values(v, s, o);
}

int64_t Tensor::size(int64_t d) const {
  HAP_CHECK(dim() > 0, "size(", d, "): tensor ", str(), " is a scalar and has no dims");
  return impl_->shape[wrap_dim(d, dim())];
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element to misplace; a size-0 dim zeroes `expected` below
  int64_t expected = 1;
  for (size_t i = impl_->shape.size(); i-- > 0;) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "undefined";
  std::ostringstream os;
  os << dtype_name(dtype()) << shape_str(shape()) << " " << device().str();
  return os.str();
}

void* Tensor::raw_data() const {
  HAP_CHECK(has_storage(), "tensor ", str(), " has no storage (a traced, shape-only tensor)");
  return static_cast<char*>(impl_->storage->data) + impl_->offset * dtype_size(dtype());
}

namespace {
std::array<DeviceTensorOps, kNumDeviceKinds>& device_tensor_ops() {
  static std::array<DeviceTensorOps, kNumDeviceKinds> ops{};
  return ops;
}

// The elementwise operations of a device tensor's backend; an error naming the call and the
// device when no backend registered them.
const DeviceTensorOps& device_ops(const Tensor& t, const char* op) {
  const DeviceTensorOps& ops = device_tensor_ops()[static_cast<size_t>(t.device().kind)];
  HAP_CHECK(ops.fill != nullptr && ops.copy != nullptr, op, " on ", t.str(), ": no backend for ",
            t.device().str(), " is built into this library");
  return ops;
}
}  // namespace

void register_device_tensor_ops(DeviceKind kind, const DeviceTensorOps& ops) {
  HAP_CHECK(kind != DeviceKind::CPU, "register_device_tensor_ops: host operations are built in");
  device_tensor_ops()[static_cast<size_t>(kind)] = ops;
}

DeviceTensorOps registered_device_tensor_ops(DeviceKind kind) {
  return device_tensor_ops()[static_cast<size_t>(kind)];
}

double Tensor::item_at(int64_t flat) const {
  HAP_CHECK(flat >= 0 && flat < numel(), "item_at: index ", flat, " out of range for ", str());
  if (!device().is_cpu()) return to(Device::cpu()).item_at(flat);
  int64_t off = 0;
  for (size_t i = impl_->shape.size(); i-- > 0;) {
    int64_t s = impl_->shape[i];
    off += (flat % s) * impl_->strides[i];
    flat /= s;
  }
  double out = 0;
  dispatch_all_types(dtype(), [&](auto tag) {
    using T = decltype(tag);
    out = convert<double>(static_cast<const T*>(raw_data())[off]);
  });
  return out;
}

double Tensor::item() const {
  HAP_CHECK(numel() == 1, "item() needs a tensor with one element, got ", str());
  return item_at(0);
}

std::vector<double> Tensor::to_vector() const {
  if (!device().is_cpu()) return to(Device::cpu()).to_vector();
  Tensor c = to(DType::F64);
  const double* p = c.data<double>();
  return std::vector<double>(p, p + c.numel());
}

std::vector<float> Tensor::to_float_vector() const {
  if (!device().is_cpu()) return to(Device::cpu()).to_float_vector();
  Tensor c = to(DType::F32);
  const float* p = c.data<float>();
  return std::vector<float>(p, p + c.numel());
}

Tensor Tensor::as_strided(const Shape& shape, const Strides& strides, int64_t offset) const {
  HAP_ASSERT(shape.size() == strides.size());
  if (has_storage()) {  // every element of the view must lie inside the storage
    int64_t lo = offset, hi = offset, n = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      n *= shape[d];
      if (shape[d] == 0) continue;
      (strides[d] < 0 ? lo : hi) += (shape[d] - 1) * strides[d];
    }
    const int64_t elements =
        static_cast<int64_t>(impl_->storage->nbytes / std::max<size_t>(dtype_size(dtype()), 1));
    HAP_CHECK(n == 0 || (lo >= 0 && hi < elements), "as_strided: the view ", shape_str(shape),
              " with strides ", shape_str(strides), " at offset ", offset, " reaches elements ", lo,
              " to ", hi, " of a storage of ", elements, " ", dtype_name(dtype()), " elements");
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = impl_->dtype;
  impl->device = impl_->device;
  return Tensor(impl);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  if (!has_storage()) return meta(shape(), dtype(), device());
  Tensor out = empty(shape(), TensorOptions{}.with_dtype(dtype()).with_device(device()));
  if (device().is_cpu()) {
    strided_copy(out, *this);
  } else if (is_contiguous()) {
    copy_bytes(out.raw_data(), device(), raw_data(), device(), nbytes());
  } else {
    device_ops(*this, "clone").copy(out, *this);
  }
  return out;
}

Tensor Tensor::to(DType d) const {
  if (d == dtype()) return contiguous();
  if (!has_storage()) return meta(shape(), d, device());
  Tensor out = empty(shape(), TensorOptions{}.with_dtype(d).with_device(device()));
  if (device().is_cpu())
    strided_copy(out, *this);
  else
    device_ops(*this, "to(dtype)").copy(out, *this);
  return out;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  if (!has_storage()) return meta(shape(), dtype(), d);
  const Tensor src = contiguous();  // a view is packed on its own device first
  Tensor out = empty(shape(), TensorOptions{}.with_dtype(dtype()).with_device(d));
  copy_bytes(out.raw_data(), d, src.raw_data(), src.device(), nbytes());
  return out;
}

Tensor Tensor::detach() const { return as_strided(shape(), strides(), offset()); }

void Tensor::copy_from(const Tensor& src) const {
  HAP_CHECK(src.shape() == shape(), "copy_from: source shape ", shape_str(src.shape()),
            " differs from destination shape ", shape_str(shape()));
  if (device().is_cpu()) {
    strided_copy(*this, src.device().is_cpu() ? src : src.to(Device::cpu()));
    return;
  }
  if (src.device() == device()) {  // on one device: the backend's elementwise copy
    device_ops(*this, "copy_from").copy(*this, src);
    return;
  }
  // From the host or another device: packed bytes of this dtype, then placed into this view.
  const Tensor s = src.device().is_cpu() ? src.to(dtype()).contiguous()
                                         : src.to(Device::cpu()).to(dtype()).contiguous();
  if (is_contiguous()) {
    copy_bytes(raw_data(), device(), s.raw_data(), s.device(), nbytes());
    return;
  }
  device_ops(*this, "copy_from").copy(*this, s.to(device()));
}

void Tensor::fill_(double value) const {
  if (!has_storage()) return;  // shape-only (MetaGuard)
  if (!device().is_cpu()) {
    device_ops(*this, "fill_").fill(*this, value);
    return;
  }
  dispatch_all_types(dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v = convert<T>(value);
    if (is_contiguous()) {
      T* p = data<T>();
      int64_t n = numel();
#pragma omp parallel for if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) p[i] = v;
    } else {
      for_each_offset(shape(), strides(),
                      [&](int64_t off) { static_cast<T*>(raw_data())[off] = v; });
    }
  });
}

Tensor& Tensor::set_requires_grad(bool r) {
  if (r)
    HAP_CHECK(is_floating(dtype()), "only floating-point tensors can require grad, got ", str());
  if (!impl_->autograd) impl_->autograd = std::make_unique<AutogradMeta>();
  impl_->autograd->requires_grad = r;
  return *this;
}

Tensor Tensor::grad() const {
  if (!impl_->autograd || !impl_->autograd->grad) return Tensor();
  return Tensor(impl_->autograd->grad);
}

void Tensor::set_grad(const Tensor& g) const {
  if (!impl_->autograd) impl_->autograd = std::make_unique<AutogradMeta>();
  impl_->autograd->grad = g.impl_ptr();
}

void Tensor::zero_grad() const {
  if (impl_->autograd) impl_->autograd->grad.reset();
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> none;
  return impl_->autograd ? impl_->autograd->grad_fn : none;
}

}  // namespace hap
