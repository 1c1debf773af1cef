// Plan files read back: every plan the synthesizer writes loads as the same program, and a plan
// edited by hand or damaged is refused with the field and what was wrong, never run halfway.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "ops/functional.h"
#include "synth/synthesizer.h"
#include "tests/factor_broadcast_util.h"
#include "tests/test_util.h"
#include "tests/zero_storage_util.h"
#include "train/config.h"
#include "train/plan_io.h"

namespace hap::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Model {
  synth::Graph graph;
  synth::Cluster cluster;
};

// A two-layer MLP with a residual branch on three uneven devices.
Model small_model() {
  Tensor x = Tensor::meta({12, 10}, DType::F32), w1 = Tensor::meta({16, 10}, DType::F32),
         b1 = Tensor::meta({16}, DType::F32), w2 = Tensor::meta({10, 16}, DType::F32);
  Model s;
  s.graph = synth::trace(
      [&] {
        Tensor h = gelu(linear(x, w1, b1));
        return mean(softmax(linear(h, w2) + x, -1));
      },
      {{"w1", w1}, {"b1", b1}, {"w2", w2}}, {{"x", x}});
  std::vector<synth::Device> devs = {{"a", "cpu", 4e9, int64_t{1} << 30, -1},
                                     {"b", "cpu", 2e9, int64_t{1} << 30, -1},
                                     {"c", "cpu", 1e9, int64_t{1} << 30, -1}};
  s.cluster.name = "three";
  s.cluster.add_node("n0", {1e8, 1e-5}, devs);
  s.cluster.validate();
  return s;
}

// hap on every device (these files are written with the whole cluster's cost model).
synth::SynthesisOptions on_all_devices() {
  synth::SynthesisOptions o;
  o.select_devices = false;
  return o;
}

fs::path plan_path() {
  return fs::temp_directory_path() / ("hap_plan_io_" + std::to_string(::getpid()) + ".json");
}

std::string load_error(const synth::CostModel& cm, const json& j) {
  std::ofstream(plan_path()) << j.dump();
  return test_util::error_of([&] { load_plan(plan_path().string(), cm); });
}

TEST(PlanFile, EveryStrategysPlanLoadsAsTheSameProgram) {
  const Model s = small_model();
  const synth::CostModel cm(s.graph, s.cluster);
  for (synth::Strategy st :
       {synth::Strategy::Hap, synth::Strategy::DpEv, synth::Strategy::DpCp, synth::Strategy::Tp}) {
    synth::SynthesisOptions o;
    o.strategy = st;
    o.select_devices = false;  // on all three (a subset's file: the next test)
    const synth::DistributedProgram p = synth::synthesize(s.graph, s.cluster, o);
    save_plan(plan_path().string(), cm, p);
    const synth::DistributedProgram back = load_plan(plan_path().string(), cm);
    EXPECT_EQ(synth::program_hash(back), synth::program_hash(p)) << synth::strategy_name(st);
    EXPECT_NEAR(back.predicted_step_s, p.predicted_step_s, 1e-12 + 1e-9 * p.predicted_step_s);
    // Each device's compute too (the report prints it).
    ASSERT_EQ(back.device_compute_s.size(), p.device_compute_s.size());
    for (size_t d = 0; d < p.device_compute_s.size(); ++d) {
      EXPECT_GT(p.device_compute_s[d], 0.0);
      EXPECT_NEAR(back.device_compute_s[d], p.device_compute_s[d],
                  1e-15 + 1e-9 * p.device_compute_s[d])
          << synth::strategy_name(st) << " device " << d;
    }
  }
  fs::remove(plan_path());
}

// A program that recomputes its segments says so in its file and loads as the same program,
// priced and sized as it runs (more time, less memory); a recompute list of the wrong length is
// refused.
TEST(PlanFile, RecomputationIsWrittenAndReadBack) {
  const Model s = small_model();
  const synth::CostModel cm(s.graph, s.cluster);
  synth::SynthesisOptions o = on_all_devices();
  const synth::DistributedProgram plain = synth::synthesize(s.graph, s.cluster, o);
  o.recompute = synth::Recompute::All;
  const synth::DistributedProgram p = synth::synthesize(s.graph, s.cluster, o);
  ASSERT_FALSE(p.recompute.empty());
  EXPECT_NE(synth::program_hash(p), synth::program_hash(plain));
  save_plan(plan_path().string(), cm, p);
  const synth::DistributedProgram back = load_plan(plan_path().string(), cm);
  EXPECT_EQ(back.recompute, p.recompute);
  EXPECT_EQ(synth::program_hash(back), synth::program_hash(p));
  EXPECT_NEAR(back.predicted_step_s, p.predicted_step_s, 1e-12 + 1e-9 * p.predicted_step_s);
  for (size_t d = 0; d < p.device_memory_bytes.size(); ++d)
    EXPECT_NEAR(back.device_memory_bytes[d], p.device_memory_bytes[d], 1.0);
  json j = plan_to_json(cm, p);
  j["recompute"] = json::array({true});
  j["ratios"] = plan_to_json(cm, p)["ratios"];
  if (p.recompute.size() != 1) {
    const std::string m = load_error(cm, j);
    EXPECT_NE(m.find("recompute"), std::string::npos) << m;
  }
  j["recompute"] = json::array();
  for (size_t i = 0; i < p.recompute.size(); ++i) j["recompute"].push_back(1);
  const std::string m = load_error(cm, j);
  EXPECT_NE(m.find("recompute[0]"), std::string::npos) << m;
  fs::remove(plan_path());
}

// A program on some of the devices is written with its devices' names and the fingerprint of
// that subset; plan_devices finds them in the whole cluster and the file loads as the same
// program under the subset's cost model. A name the cluster lacks is refused; a cost model of
// another size cannot write the program.
TEST(PlanFile, AProgramOnADeviceSubsetNamesItsDevices) {
  const Model s = small_model();
  synth::SynthesisOptions o;
  o.devices = {0, 2};
  synth::DistributedProgram p = synth::synthesize(s.graph, s.cluster, o);
  ASSERT_EQ(p.devices, (std::vector<int>{0, 2}));
  const synth::Cluster sub = s.cluster.subset(p.devices);
  const synth::CostModel sub_cm(s.graph, sub);
  save_plan(plan_path().string(), sub_cm, p);
  EXPECT_EQ(plan_devices(plan_path().string(), s.cluster), (std::vector<int>{0, 2}));
  synth::DistributedProgram back = load_plan(plan_path().string(), sub_cm);
  back.devices = plan_devices(plan_path().string(), s.cluster);
  EXPECT_EQ(synth::program_hash(back), synth::program_hash(p));
  json j = plan_to_json(sub_cm, p);
  EXPECT_EQ(j["devices"], json::array({"a", "c"}));
  j["devices"] = json::array({"a", "z"});
  std::ofstream(plan_path()) << j.dump();
  EXPECT_NE(test_util::error_of([&] {
              plan_devices(plan_path().string(), s.cluster);
            }).find("has no device 'z'"),
            std::string::npos);
  const synth::CostModel all_cm(s.graph, s.cluster);
  EXPECT_THROW(plan_to_json(all_cm, p), Error);
  // A plan on all devices names none.
  o.devices.clear();
  o.select_devices = false;
  EXPECT_FALSE(plan_to_json(all_cm, synth::synthesize(s.graph, s.cluster, o)).contains("devices"));
  fs::remove(plan_path());
}

TEST(PlanFile, OutOfRangeIntegersAndPropertiesNameTheField) {
  const Model s = small_model();
  const synth::CostModel cm(s.graph, s.cluster);
  const synth::DistributedProgram p = synth::synthesize(s.graph, s.cluster, on_all_devices());
  const json good = plan_to_json(cm, p);
  size_t compute = 0, collective = 0;
  for (size_t i = 0; i < good["instructions"].size(); ++i) {
    const std::string kind = good["instructions"][i]["kind"];
    if (kind == "compute") compute = i;
    if (kind != "compute" && kind != "update" && kind != "grad_all_reduce") collective = i;
  }
  ASSERT_GT(collective + compute, 0u) << good.dump(1);
  const std::string at = "instructions[" + std::to_string(compute) + "]";
  auto edit = [&](const std::function<void(json&)>& f) {
    json j = good;
    f(j);
    return load_error(cm, j);
  };
  // 2^32 + 35 must not wrap to 35.
  EXPECT_HAS(edit([&](json& j) { j["instructions"][compute]["segment"] = 4294967331ull; }),
             at + ".segment: expected an integer in [0, 0], got 4294967331");
  EXPECT_HAS(edit([&](json& j) { j["instructions"][compute]["node"] = -1; }),
             at + ".node: expected an integer in [0, ");
  EXPECT_HAS(edit([&](json& j) { j["instructions"][compute]["signature"] = -2; }),
             at + ".signature: expected an integer in [-1, ");
  EXPECT_HAS(edit([&](json& j) { j["instructions"][compute]["node"] = 1.5; }),
             at + ".node: expected an integer");
  EXPECT_HAS(edit([&](json& j) { j["node_segment"][0] = 7; }),
             "node_segment[0]: expected an integer in [0, 0], got 7");
  EXPECT_HAS(edit([&](json& j) { j["storage"]["w1"] = "S(2)"; }),
             "storage.w1: S(2) names dim 2 of a tensor with 2 dims");
  EXPECT_HAS(edit([&](json& j) { j["storage"]["w1"] = "S(-1)"; }),
             "storage.w1: expected a property R, P or S(d), got 'S(-1)'");
  EXPECT_HAS(edit([&](json& j) { j["storage"]["w1"] = 3; }),
             "storage.w1: expected a property R, P or S(d), got 3");
  fs::remove(plan_path());
}

TEST(PlanFile, AFifoIsRefusedBeforeOpening) {
  const Model s = small_model();
  const synth::CostModel cm(s.graph, s.cluster);
  const fs::path fifo = plan_path().string() + ".fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_HAS(test_util::error_of([&] { load_plan(fifo.string(), cm); }),
             "cannot read the plan file: it is not a regular file");
  fs::remove(fifo);
}

// Plans that would stop the executor midway: an instruction that reads what nothing made, a
// collective turned into another kind, a missing computation.
TEST(PlanFile, ProgramsThatCannotRunAreRefusedNamingTheInstruction) {
  const Model s = small_model();
  const synth::CostModel cm(s.graph, s.cluster);
  synth::SynthesisOptions dp;
  dp.strategy = synth::Strategy::DpEv;  // a batch split: the loss's Partial needs no collective,
  const json good = plan_to_json(cm, synth::synthesize(s.graph, s.cluster, dp));
  // Find the first computation reading an activation, and drop the computation producing it.
  const json& instrs = good["instructions"];
  int first_compute = -1;
  for (size_t i = 0; i < instrs.size(); ++i)
    if (instrs[i]["kind"] == "compute") {
      first_compute = static_cast<int>(i);
      break;
    }
  ASSERT_GE(first_compute, 0);
  json j = good;
  j["instructions"].erase(static_cast<size_t>(first_compute));
  const std::string m = load_error(cm, j);
  EXPECT_HAS(m, "which no earlier instruction makes");
  // The last computation makes the loss: without it, the program never does.
  int last_compute = -1;
  for (size_t i = 0; i < instrs.size(); ++i)
    if (instrs[i]["kind"] == "compute") last_compute = static_cast<int>(i);
  j = good;
  j["instructions"].erase(static_cast<size_t>(last_compute));
  EXPECT_HAS(load_error(cm, j), "the program never makes the loss");
  // A hap plan with a collective: the collective edited into a kind that cannot do it.
  const json hap = plan_to_json(cm, synth::synthesize(s.graph, s.cluster, on_all_devices()));
  int edited = 0;
  for (size_t i = 0; i < hap["instructions"].size(); ++i) {
    const std::string kind = hap["instructions"][i]["kind"];
    if (kind == "compute" || kind == "update") continue;
    j = hap;
    j["instructions"][i]["kind"] = kind == "all_gather" ? "reduce_scatter" : "all_gather";
    EXPECT_HAS(load_error(cm, j), "instructions[" + std::to_string(i) + "]: ");
    ++edited;
  }
  EXPECT_GT(edited, 0) << hap.dump(1);
  fs::remove(plan_path());
}

// A program with hierarchical all-reduces (the small model's three devices as two nodes joined by
// a slow link) loads as the same program, its ranks' nodes taken from the cluster; the form on
// a collective that has none, or on a cluster of one node, is refused naming the instruction.
TEST(PlanFile, HierarchicalAllReducesAreWrittenAndReadBack) {
  Model s = small_model();
  synth::Cluster two;
  two.name = "two-nodes";
  two.inter_node = {1e6, 1e-3};
  two.add_node("n0", {1e9, 1e-5}, {s.cluster.devices[0], s.cluster.devices[1]});
  two.add_node("n1", {1e9, 1e-5}, {s.cluster.devices[2]});
  two.validate();
  const synth::CostModel cm(s.graph, two);
  synth::SynthesisOptions o = on_all_devices();
  o.strategy = synth::Strategy::DpCp;
  const synth::DistributedProgram p = synth::synthesize(s.graph, two, o);
  ASSERT_EQ(p.nodes, (std::vector<int>{0, 0, 1}));
  save_plan(plan_path().string(), cm, p);
  const synth::DistributedProgram back = load_plan(plan_path().string(), cm);
  EXPECT_EQ(back.nodes, p.nodes);
  EXPECT_EQ(synth::program_hash(back), synth::program_hash(p));
  EXPECT_NEAR(back.predicted_step_s, p.predicted_step_s, 1e-12 + 1e-9 * p.predicted_step_s);
  const json good = plan_to_json(cm, p);
  int hierarchical = -1;
  for (size_t i = 0; i < good["instructions"].size(); ++i)
    if (good["instructions"][i].value("method", "") == "hierarchical") {
      hierarchical = static_cast<int>(i);
      break;
    }
  ASSERT_GE(hierarchical, 0) << good.dump(1);
  json j = good;
  j["instructions"][hierarchical]["kind"] = "all_to_all";
  EXPECT_HAS(load_error(cm, j), "instructions[" + std::to_string(hierarchical) +
                                    "].method: only an all_reduce, grad_all_reduce, all_gather or "
                                    "reduce_scatter can be hierarchical");
  // On the one-node cluster (another fingerprint: the plan is rewritten for it).
  const synth::CostModel one(s.graph, s.cluster);
  j = plan_to_json(one, synth::synthesize(s.graph, s.cluster, o));
  for (auto& in : j["instructions"])
    if (in["kind"] == "grad_all_reduce") in["method"] = "hierarchical";
  EXPECT_HAS(load_error(one, j), "hierarchical needs several nodes");
  fs::remove(plan_path());
}

// A program with ZeRO storage (parameters stored Sharded(0), all-gathered for use, some gathered
// again in backward) loads as the same program, priced and sized alike; `regather` on another
// instruction, or not a boolean, is refused naming the instruction.
TEST(PlanFile, ZeroStorageIsWrittenAndReadBack) {
  const Model s = small_model();
  const synth::CostModel cm(s.graph, s.cluster);
  synth::SynthesisOptions o = on_all_devices();
  o.strategy = synth::Strategy::DpCp;
  synth::DistributedProgram p = synth::synthesize(s.graph, s.cluster, o);
  ASSERT_GE(test_util::apply_zero_storage(s.graph, p, false), 2);
  for (synth::Instruction& in : p.instructions)  // the first gathered again, the others kept
    if (in.kind == synth::InstrKind::AllGather) {
      in.regather = true;
      break;
    }
  p.predicted_step_s = synth::recost(cm, p.instructions, p.ratios);
  p.device_memory_bytes = synth::program_memory(cm, p.instructions, p.storage, p.ratios);
  save_plan(plan_path().string(), cm, p);
  const synth::DistributedProgram back = load_plan(plan_path().string(), cm);
  EXPECT_EQ(synth::program_hash(back), synth::program_hash(p));
  EXPECT_NEAR(back.predicted_step_s, p.predicted_step_s, 1e-12 + 1e-9 * p.predicted_step_s);
  EXPECT_EQ(back.device_memory_bytes, p.device_memory_bytes);
  int again = 0, kept = 0;
  for (const synth::Instruction& in : back.instructions)
    if (in.kind == synth::InstrKind::AllGather) (in.regather ? again : kept) += 1;
  EXPECT_EQ(again, 1);
  EXPECT_GE(kept, 1);
  // Gathering again is priced (one more all-gather) and keeps less. (With the gradient
  // all-reduces overlapped, the step may still be shorter: a kept copy's reduce-scatter joins
  // the gradient buckets' channel, a copy gathered again runs it in the backward pass itself.)
  synth::DistributedProgram none = p;
  for (synth::Instruction& in : none.instructions) in.regather = false;
  EXPECT_NE(synth::program_hash(none), synth::program_hash(p));
  synth::recost(cm, none.instructions, none.ratios);
  for (size_t i = 0; i < p.instructions.size(); ++i) {
    const synth::Instruction& in = p.instructions[i];
    if (!in.regather) continue;
    const double one_gather =
        cm.communication(synth::InstrKind::AllGather, in.tensor, in.method, true)
            .eval(p.ratios[in.segment]) -
        cm.communication(synth::InstrKind::AllGather, in.tensor, in.method)
            .eval(p.ratios[in.segment]);
    EXPECT_GT(one_gather, 0);
    EXPECT_NEAR(in.cost_s - none.instructions[i].cost_s, one_gather, 1e-15);
  }
  const synth::CostModel serial(s.graph, s.cluster, 2, false);
  EXPECT_GT(synth::recost(serial, p.instructions, p.ratios),
            synth::recost(serial, none.instructions, none.ratios));
  // A copy gathered again is still held while it is read (the largest such copy on top of what
  // is kept): one of them saves nothing at the peak, all of them keep only the largest.
  const std::vector<double> kept_mem =
      synth::program_memory(cm, none.instructions, none.storage, none.ratios);
  synth::DistributedProgram all = p;
  for (synth::Instruction& in : all.instructions)
    if (in.kind == synth::InstrKind::AllGather) in.regather = true;
  const std::vector<double> again_mem =
      synth::program_memory(cm, all.instructions, all.storage, all.ratios);
  for (size_t d = 0; d < kept_mem.size(); ++d) {
    EXPECT_LE(p.device_memory_bytes[d], kept_mem[d] * (1 + 1e-12));  // (sums in another order)
    EXPECT_LT(again_mem[d], kept_mem[d]);
  }
  const json good = plan_to_json(cm, p);
  int gather = -1, other = -1;
  for (size_t i = 0; i < good["instructions"].size(); ++i) {
    const json& in = good["instructions"][i];
    if (in.value("regather", false)) gather = static_cast<int>(i);
    if (in["kind"] == "update") other = static_cast<int>(i);
  }
  ASSERT_GE(gather, 0) << good.dump(1);
  ASSERT_GE(other, 0) << good.dump(1);
  json j = good;
  j["instructions"][gather]["regather"] = "yes";
  EXPECT_HAS(load_error(cm, j),
             "instructions[" + std::to_string(gather) + "].regather: expected true or false");
  j = good;
  j["instructions"][other]["regather"] = true;
  EXPECT_HAS(load_error(cm, j), "instructions[" + std::to_string(other) +
                                    "].regather: only the all_gather of a parameter");
  fs::remove(plan_path());
}

// A program that broadcasts factors loads as the same program, priced alike; a factor_broadcast
// whose parameter is also all-reduced, that follows no compute of its node, or that gathers
// hierarchically is refused naming the instruction.
TEST(PlanFile, FactorBroadcastIsWrittenAndReadBack) {
  const Model s = small_model();
  const synth::CostModel cm(s.graph, s.cluster);
  synth::SynthesisOptions o = on_all_devices();
  o.strategy = synth::Strategy::DpCp;
  synth::DistributedProgram p = synth::synthesize(s.graph, s.cluster, o);
  ASSERT_GE(test_util::apply_factor_broadcast(s.graph, p, synth::CollectiveMethod::Padded), 1);
  p.predicted_step_s = synth::recost(cm, p.instructions, p.ratios);
  save_plan(plan_path().string(), cm, p);
  const synth::DistributedProgram back = load_plan(plan_path().string(), cm);
  EXPECT_EQ(synth::program_hash(back), synth::program_hash(p));
  EXPECT_NEAR(back.predicted_step_s, p.predicted_step_s, 1e-12 + 1e-9 * p.predicted_step_s);
  const json good = plan_to_json(cm, p);
  int at = -1, compute = -1;
  for (size_t i = 0; i < good["instructions"].size(); ++i) {
    const json& in = good["instructions"][i];
    if (in["kind"] == "factor_broadcast" && at < 0) at = static_cast<int>(i);
  }
  ASSERT_GE(at, 1) << good.dump(1);
  for (int i = 0; i < at; ++i)
    if (good["instructions"][i]["kind"] == "compute" &&
        good["instructions"][i]["node"] == good["instructions"][at]["node"])
      compute = i;
  ASSERT_GE(compute, 0);
  const std::string where = "instructions[" + std::to_string(at) + "]";
  json j = good;
  j["instructions"][at]["method"] = "hierarchical";
  EXPECT_HAS(load_error(cm, j), where + ".method: a factor_broadcast gathers padded or grouped");
  // Moved before its node's computation.
  j = good;
  json moved = j["instructions"][at];
  j["instructions"].erase(static_cast<size_t>(at));
  j["instructions"].insert(j["instructions"].begin() + compute, moved);
  EXPECT_HAS(load_error(cm, j),
             "instructions[" + std::to_string(compute) + "]: factor_broadcast at Linear");
  // Its parameter's gradient also all-reduced.
  j = good;
  const int node = good["instructions"][at]["node"].get<int>();
  const int param = s.graph.nodes[static_cast<size_t>(node)].inputs[1];  // the linear's weight
  j["instructions"].push_back({{"kind", "grad_all_reduce"},
                               {"segment", good["instructions"][at]["segment"]},
                               {"tensor", param},
                               {"from", "P"},
                               {"to", "R"},
                               {"method", "grouped"},
                               {"cost_s", 0.0}});
  EXPECT_HAS(load_error(cm, j), "also has a grad_all_reduce");
  fs::remove(plan_path());
}

}  // namespace
}  // namespace hap::train
