// The training metrics log: one JSON object per line, flushed after each, so a run that crashes
// keeps everything it logged.
#pragma once
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace hap::app {

class JsonlLog {
 public:
  // An empty path logs nothing.
  explicit JsonlLog(const std::string& path) {
    if (path.empty()) return;
    std::filesystem::path p(path);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    out_.open(path, std::ios::trunc);
    HAP_CHECK(out_.good(), "train.log_file: cannot open '", path, "' for writing");
  }
  void write(const nlohmann::json& j) {
    if (!out_.is_open()) return;
    out_ << j.dump() << "\n";
    out_.flush();
  }

 private:
  std::ofstream out_;
};

}  // namespace hap::app
