// Output files (logs, plans, checkpoints) are checked before the work that fills them starts, so a
// path that cannot be written is reported at once rather than after a long run.
#pragma once
#include <string>

namespace hap::train {

// Why a file cannot be written at `path` (the OS's reason, or "it is a directory", "'x' is not a
// directory"), or "" when it can. With create_parents, missing parent directories are fine when
// the nearest existing ancestor is a directory this process may write into.
std::string unwritable_reason(const std::string& path, bool create_parents = false);

// Writing an output file atomically: core/atomic_file.h (write_file_atomically,
// remove_partial_output).

}  // namespace hap::train
