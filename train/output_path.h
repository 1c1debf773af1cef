// Output files (logs, plans, checkpoints) are checked before the work that fills them starts, so a
// path that cannot be written is reported at once rather than after a long run.
#pragma once
#include <string>

namespace hap::train {

// Why a file cannot be written at `path` (the OS's reason, or "it is a directory", "'x' is not a
// directory"), or "" when it can. With create_parents, missing parent directories are fine when
// the nearest existing ancestor is a directory this process may write into.
std::string unwritable_reason(const std::string& path, bool create_parents = false);

// Writes `text` to `path` through a temporary file in the same folder and a rename, so an
// interrupted write leaves the old file or none, never half a file. Throws hap::Error naming the
// path and the reason.
void write_file_atomically(const std::string& path, const std::string& text);

// Removes the temporary file of a write_file_atomically in progress, if any. Async-signal-safe:
// for a SIGINT/SIGTERM handler that then ends the process.
void remove_partial_output();

}  // namespace hap::train
