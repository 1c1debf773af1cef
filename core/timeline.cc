#include "core/timeline.h"

#include <atomic>
#include <chrono>
#include <thread>

namespace hap::timeline {

namespace {

using Clock = std::chrono::steady_clock;
std::atomic<bool> g_on{false};
std::thread::id g_thread;
Clock::time_point g_epoch;
std::vector<Span> g_spans;

double now_us() {
  return std::chrono::duration<double, std::micro>(Clock::now() - g_epoch).count();
}

}  // namespace

bool recording() {
  return g_on.load(std::memory_order_relaxed) && std::this_thread::get_id() == g_thread;
}

void start() {
  g_spans.clear();
  g_thread = std::this_thread::get_id();
  g_epoch = Clock::now();
  g_on.store(true);
}

std::vector<Span> stop() {
  g_on.store(false);
  std::vector<Span> out;
  out.swap(g_spans);
  return out;
}

Scope::Scope(const char* category, std::string name, std::string detail)
    : on_(recording()), category_(category) {
  if (!on_) return;
  name_ = std::move(name);
  detail_ = std::move(detail);
  start_us_ = now_us();
}

Scope::~Scope() {
  if (!on_ || !recording()) return;
  g_spans.push_back(
      {std::move(name_), category_, start_us_, now_us() - start_us_, std::move(detail_)});
}

}  // namespace hap::timeline
