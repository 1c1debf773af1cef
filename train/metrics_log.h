// The training metrics log: one JSON object per line, flushed after each, so a run that crashes
// keeps everything it logged.
#pragma once
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "train/output_path.h"

namespace hap::train {

class JsonlLog {
 public:
  // An empty path logs nothing. Missing parent folders are created; a path that cannot be
  // written is an error naming it and the reason. `append` (a resumed run) adds to the records of
  // the run it continues instead of starting the file afresh.
  explicit JsonlLog(const std::string& path, bool append = false) {
    if (path.empty()) return;
    const std::string reason = unwritable_reason(path, /*create_parents=*/true);
    HAP_CHECK(reason.empty(), "train.log_file: cannot write '", path, "': ", reason);
    std::filesystem::path p(path);
    std::error_code ec;
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
    HAP_CHECK(!ec, "train.log_file: cannot create the folder of '", path, "': ", ec.message());
    out_.open(path, append ? std::ios::app : std::ios::trunc);
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

}  // namespace hap::train
