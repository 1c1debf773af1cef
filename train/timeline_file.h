// `hap-train --trace FILE`: the timelines of chosen training steps of every rank (core/timeline.h)
// merged into one Chrome trace / Perfetto JSON file (open it in ui.perfetto.dev or
// chrome://tracing): one track per rank, named after its device, with every op's kernel, every
// collective, every wait inside one, and the phases of each step (forward, backward, grad_norm,
// update) as complete ("X") events in microseconds.
#pragma once
#include <string>
#include <vector>

#include "core/timeline.h"

namespace hap::train {

// One rank's spans as a JSON array's elements (no brackets; "" for none): events of process
// `rank` (pid), starting with its name.
std::string timeline_events_json(const std::vector<timeline::Span>& spans, int rank,
                                 const std::string& track_name);

// Writes the ranks' event lists (from timeline_events_json) as one trace file, atomically.
void write_timeline_file(const std::string& path, const std::vector<std::string>& rank_events);

}  // namespace hap::train
