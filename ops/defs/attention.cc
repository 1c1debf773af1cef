// Placeholder until the attention ops land (being written now); the registry reports them incomplete.
#include "ops/defs/common.h"

namespace hap::ops {
void register_attention_ops(OpTable&) {}
}  // namespace hap::ops
