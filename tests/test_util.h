// Helpers shared by the unit tests: the message of an expected hap::Error, random tensors.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace hap::test_util {

// The message of the hap::Error that f throws; a test failure if it throws nothing or another type.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected hap::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected hap::Error, nothing was thrown";
  return "";
}

inline TensorOptions opts(DType dt, bool rg = false) {
  return TensorOptions{}.with_dtype(dt).with_requires_grad(rg);
}

// Uniform in [-1, 1) from the counter-based RNG.
inline Tensor uni(const Shape& s, uint64_t seed, DType dt = DType::F64, bool rg = false) {
  Tensor t = Tensor::empty(s, opts(dt));
  fill_uniform(t, seed, 0, -1.0, 1.0);
  if (rg) t.set_requires_grad(true);
  return t;
}

// A fresh folder for one test (named after it and the process), removed with the object.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("hap_" + tag + "_" + std::to_string(::getpid()) + "_" + (info ? info->name() : "x"));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

inline std::vector<char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace hap::test_util

// Expects `part` to occur in the message `msg`.
#define EXPECT_HAS(msg, part) \
  EXPECT_NE(std::string(msg).find(part), std::string::npos) << "message: " << (msg)
