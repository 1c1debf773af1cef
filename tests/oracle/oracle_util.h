// Running the PyTorch oracle scripts from C++ tests: write inputs as .hapt, run
// /usr/bin/python3 SCRIPT, read the outputs back.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/serialize.h"

namespace hap::oracle {

inline std::filesystem::path temp_dir(const std::string& tag) {
  auto base = std::filesystem::temp_directory_path() /
              ("hap_oracle_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(base);
  return base;
}

// Runs a script from tests/oracle with arguments; returns its exit code.
inline int run_script(const std::string& script, const std::vector<std::string>& args) {
  std::string cmd = std::string(HAP_PYTHON) + " " + HAP_SOURCE_DIR + "/tests/oracle/" + script;
  for (const auto& a : args) cmd += " '" + a + "'";
  return std::system(cmd.c_str());
}

inline std::map<std::string, Tensor> load_map(const std::string& path) {
  std::map<std::string, Tensor> m;
  for (auto& [name, t] : load_tensors(path)) m[name] = t;
  return m;
}

// ||a - b|| / max(||b||, tiny), over all elements.
inline double rel_norm_error(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector(), y = b.to_vector();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

}  // namespace hap::oracle
