// Writing output files atomically: a reader (or a resumed run) sees either the old file or the
// complete new one, never a half-written file, even when the writer is killed.
#pragma once
#include <cstdio>
#include <functional>
#include <string>

namespace hap {

// The temporary `path` is written through before the rename: `path` + ".tmp." + the process id.
// Leftovers of a killed writer carry this infix (a trainer removes them at its next start).
std::string temporary_path(const std::string& path);
inline constexpr const char* kTemporaryInfix = ".tmp.";

// Creates temporary_path(path), lets `write` fill it, flushes and fsyncs it, renames it over
// `path` and fsyncs the folder. Throws hap::Error naming `what` (the caller, e.g.
// "save_tensors"), the file and the OS's reason; on any error the temporary is removed and `path`
// keeps its old content. `write` reports its own write errors by throwing (check_write helps).
void write_atomically(const std::string& path, const std::string& what,
                      const std::function<void(std::FILE*)>& write);

// write_atomically of `text`.
void write_file_atomically(const std::string& path, const std::string& text);

// Removes the temporary file of a write_atomically in progress, if any. Async-signal-safe: for a
// SIGINT/SIGTERM handler that then ends the process.
void remove_partial_output();

// fwrite of n bytes or a hap::Error naming `what` and `path`.
void check_write(std::FILE* f, const void* data, std::size_t n, const std::string& what,
                 const std::string& path);

}  // namespace hap
