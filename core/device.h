// Where a tensor's storage lives.
#pragma once
#include <string>

namespace hap {

enum class DeviceKind : uint8_t { CPU = 0, CUDA = 1 };
constexpr size_t kNumDeviceKinds = 2;

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;

  static Device cpu() { return {DeviceKind::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::CUDA, index}; }
  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_cuda() const { return kind == DeviceKind::CUDA; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const {
    return kind == DeviceKind::CPU ? std::string("cpu") : "cuda:" + std::to_string(index);
  }
};

}  // namespace hap
