#include "train/timeline_file.h"

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"

namespace hap::train {

std::string timeline_events_json(const std::vector<timeline::Span>& spans, int rank,
                                 const std::string& track_name) {
  using nlohmann::json;
  std::string out = json{{"name", "process_name"},
                         {"ph", "M"},
                         {"pid", rank},
                         {"tid", 0},
                         {"args", {{"name", track_name}}}}
                        .dump();
  out += "," + json{{"name", "process_sort_index"},
                    {"ph", "M"},
                    {"pid", rank},
                    {"tid", 0},
                    {"args", {{"sort_index", rank}}}}
                   .dump();
  for (const timeline::Span& s : spans) {
    json e = {{"name", s.name}, {"cat", s.category}, {"ph", "X"},           {"pid", rank},
              {"tid", 0},       {"ts", s.start_us},  {"dur", s.duration_us}};
    if (!s.detail.empty()) e["args"] = {{"detail", s.detail}};
    // Names and modules come from the model: invalid UTF-8 is replaced, never thrown on.
    out += "," + e.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return out;
}

void write_timeline_file(const std::string& path, const std::vector<std::string>& rank_events) {
  write_atomically(path, "--trace", [&](std::FILE* f) {
    const std::string head = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    check_write(f, head.data(), head.size(), "--trace", path);
    bool first = true;
    for (const std::string& events : rank_events) {
      if (events.empty()) continue;
      if (!first) check_write(f, ",\n", 2, "--trace", path);
      check_write(f, events.data(), events.size(), "--trace", path);
      first = false;
    }
    check_write(f, "\n]}\n", 4, "--trace", path);
  });
}

}  // namespace hap::train
