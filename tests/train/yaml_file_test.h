// A test fixture that writes YAML files into a per-test directory (removed afterwards), and edits
// a valid document one line at a time for the bad-input tests.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace hap::train {

class YamlFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("hap_test_yaml_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" +
            info->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& text, const std::string& name = "file.yaml") const {
    const std::filesystem::path path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }

  // `valid` with the first occurrence of `from` replaced by `to`.
  static std::string replace_first(std::string valid, const std::string& from,
                                   const std::string& to) {
    const std::size_t at = valid.find(from);
    EXPECT_NE(at, std::string::npos) << "the valid document has no '" << from << "'";
    if (at == std::string::npos) return valid;
    return valid.replace(at, from.size(), to);
  }

  std::filesystem::path dir_;
};

}  // namespace hap::train
