// Opening a CUDA library on first use (cuBLAS, cuDNN, NCCL): the first of several candidate files
// that loads, and its functions by name, each missing one named. A process that never needs the
// library never loads it; a machine without it gets the reason instead of a loader failure at
// start-up.
#pragma once
#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace hap::cuda {

// The files to try for `soname`, in order: the file the environment variable `env` names (when
// set), `soname` on the library path, then in the CUDA toolkit's folder this build was made with
// (and its lib/ beside lib64/).
std::vector<std::string> library_candidates(const char* env, const char* soname);

// The first candidate that dlopen (RTLD_NOW | RTLD_LOCAL) loads; null where none does, with
// *why saying what was tried and the loader's words.
void* open_library(const std::vector<std::string>& candidates, std::string* why);

// `lib`'s function `name` in *fn; false where it has none, with *why naming the library
// (`soname`) and the function, and `hint` (which version would have it).
template <typename F>
bool resolve_function(void* lib, const char* soname, const char* name, F* fn, std::string* why,
                      const char* hint) {
  void* sym = dlsym(lib, name);
  if (sym == nullptr) {
    *why = std::string(soname) + " has no function " + name + " (" + hint + ")";
    return false;
  }
  *fn = reinterpret_cast<F>(sym);
  return true;
}

}  // namespace hap::cuda
