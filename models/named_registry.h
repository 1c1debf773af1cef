// A registry of entries by name (the model zoo's, the datasets'): built-in entries first, then
// what programs register. Lookups return references that stay valid (entries live in a deque).
#pragma once
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"

namespace hap::nn {

template <typename Entry>
class NamedRegistry {
 public:
  // `what` names the entries in messages ("model", "dataset"); `builtins` fills the registry on
  // first use.
  NamedRegistry(const char* what, std::function<std::vector<Entry>()> builtins)
      : what_(what), builtins_(std::move(builtins)) {}

  const Entry& find(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    load();
    std::string names;
    for (const Entry& e : entries_) {
      if (e.name == name) return e;
      names += (names.empty() ? "'" : ", '") + e.name + "'";
    }
    HAP_CHECK(false, "no ", what_, " named '", name, "' is registered (registered: ", names, ")");
    throw InternalError("unreachable");
  }

  std::vector<std::string> names() {
    std::lock_guard<std::mutex> lock(mutex_);
    load();
    std::vector<std::string> out;
    for (const Entry& e : entries_) out.push_back(e.name);
    return out;
  }

  // Adds an entry; a name may be registered once.
  void add(Entry entry) {
    std::lock_guard<std::mutex> lock(mutex_);
    load();
    HAP_CHECK(!entry.name.empty(), "register_", what_, ": the ", what_, " name is empty");
    for (const Entry& e : entries_)
      HAP_CHECK(e.name != entry.name, "register_", what_, ": a ", what_, " named '", entry.name,
                "' is already registered");
    entries_.push_back(std::move(entry));
  }

 private:
  void load() {
    if (loaded_) return;
    loaded_ = true;
    for (Entry& e : builtins_()) entries_.push_back(std::move(e));
  }

  const char* what_;
  std::function<std::vector<Entry>()> builtins_;
  std::mutex mutex_;
  std::deque<Entry> entries_;
  bool loaded_ = false;
};

}  // namespace hap::nn
