// Where a tensor's storage lives.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

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

// "cpu", "cuda" (cuda:0) or "cuda:N" with N a decimal index in [0, 2^31); nullopt otherwise.
inline std::optional<Device> parse_device(std::string_view s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.substr(0, 5) != "cuda:" || s.size() == 5 || s.size() > 15) return std::nullopt;
  int64_t index = 0;
  for (char c : s.substr(5)) {
    if (c < '0' || c > '9') return std::nullopt;
    index = index * 10 + (c - '0');
  }
  if (index > 2147483647) return std::nullopt;
  return Device::cuda(static_cast<int>(index));
}

}  // namespace hap
