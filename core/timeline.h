// A timeline of what this process did, for `hap-train --trace`: spans (an op's kernel, a
// collective, a wait inside one, a phase of a training step) with their start and duration,
// recorded only while on, from the thread that turned it on (kernels' worker threads are not
// recorded; their time is inside the op's span). Written as Chrome trace / Perfetto JSON
// ("X" complete events) by train/ with one track per rank.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hap::timeline {

struct Span {
  std::string name;      // "matmul", "all_gather", "MPI_Iallgatherv", "forward"
  const char* category;  // "op", "collective", "wait", "step", "phase"
  double start_us;       // since start()
  double duration_us;
  std::string detail;  // shown as the event's args: module path, bytes, ... ("" for none)
};

// Whether spans are being recorded (cheap: check it before building a name).
bool recording();
// Starts recording on this thread (clears what was recorded): times count from now.
void start();
// Stops recording and returns the spans, in order of their end.
std::vector<Span> stop();

// Records a span from construction to destruction when recording() was true at construction.
class Scope {
 public:
  Scope(const char* category, std::string name, std::string detail = "");
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool on_;
  const char* category_;
  std::string name_, detail_;
  double start_us_ = 0;
};

}  // namespace hap::timeline
