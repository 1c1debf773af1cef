#include "core/cuda/green_context.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <mutex>

#include "core/cuda/backend.h"
#include "core/cuda/check.h"

namespace hap::cuda {

// The kernel that records the SM of every block (core/cuda/sm_ids.cu).
void launch_sm_ids(int* ids, int blocks);

namespace {

// The driver functions green contexts need, found through the runtime.
struct Driver {
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetDevResource_v12040 device_get_dev_resource = nullptr;
  PFN_cuDevSmResourceSplitByCount_v12040 sm_resource_split_by_count = nullptr;
  PFN_cuDevResourceGenerateDesc_v12040 resource_generate_desc = nullptr;
  PFN_cuGreenCtxCreate_v12040 green_ctx_create = nullptr;
  PFN_cuGreenCtxDestroy_v12040 green_ctx_destroy = nullptr;
  PFN_cuCtxFromGreenCtx_v12040 ctx_from_green_ctx = nullptr;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current = nullptr;
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuCtxGetDevResource_v12040 ctx_get_dev_resource = nullptr;
  PFN_cuGreenCtxGetDevResource_v12040 green_ctx_get_dev_resource = nullptr;
  PFN_cuGetErrorName_v6000 error_name = nullptr;
  PFN_cuGetErrorString_v6000 error_string = nullptr;
};

// The driver API version the function types above are of (the newest of their _v suffixes):
// asking for the toolkit's version instead could give a newer signature of one of them.
constexpr int kDriverApiVersion = 12040;

template <typename F>
void entry(const char* name, F* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(name, &p, kDriverApiVersion, cudaEnableDefault, &found);
  if (e != cudaSuccess) cudaGetLastError();
  HAP_CHECK(e == cudaSuccess && found == cudaDriverEntryPointSuccess && p != nullptr,
            "CUDA driver: no ", name, " (",
            e != cudaSuccess ? std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e)
            : found == cudaDriverEntryPointVersionNotSufficent
                ? std::string("the driver is older than the function")
                : std::string("not found"),
            "): green contexts need a GPU and a driver for CUDA 12.4 or newer");
  *fn = reinterpret_cast<F>(p);
}

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    entry("cuDeviceGet", &r.device_get);
    entry("cuDeviceGetDevResource", &r.device_get_dev_resource);
    entry("cuDevSmResourceSplitByCount", &r.sm_resource_split_by_count);
    entry("cuDevResourceGenerateDesc", &r.resource_generate_desc);
    entry("cuGreenCtxCreate", &r.green_ctx_create);
    entry("cuGreenCtxDestroy", &r.green_ctx_destroy);
    entry("cuCtxFromGreenCtx", &r.ctx_from_green_ctx);
    entry("cuCtxSetCurrent", &r.ctx_set_current);
    entry("cuCtxGetCurrent", &r.ctx_get_current);
    entry("cuCtxGetDevResource", &r.ctx_get_dev_resource);
    entry("cuGreenCtxGetDevResource", &r.green_ctx_get_dev_resource);
    entry("cuGetErrorName", &r.error_name);
    entry("cuGetErrorString", &r.error_string);
    return r;
  }();
  return d;
}

void check(CUresult r, const char* call, const char* file, int line) {
  if (r == CUDA_SUCCESS) return;
  const char* name = "?";
  const char* text = "?";
  driver().error_name(r, &name);
  driver().error_string(r, &text);
  throw Error(detail::concat("CUDA driver: ", call, " failed at ", file, ":", line, ": ", name,
                             ": ", text));
}

#define HAP_CU_CHECK(call) check((call), #call, __FILE__, __LINE__)

struct State {
  std::mutex mu;
  GreenContextInfo info;
  CUgreenCtx green = nullptr;
  CUcontext as_context = nullptr;  // the green context as a CUcontext (cuCtxFromGreenCtx)
  // The green contexts holding the remainders split on the way to this process's group (below).
  std::vector<CUgreenCtx> remainders;
};

State& state() {
  static State* s = new State();  // leaked on purpose: used until the process ends
  return *s;
}

SmGranularity granularity_of(const CUdevResource& r) {
  return {static_cast<int>(r.sm.smCount), static_cast<int>(r.sm.minSmPartitionSize),
          static_cast<int>(r.sm.smCoscheduledAlignment)};
}

// The whole GPU's SM resource (and its driver handle in *dev).
CUdevResource whole_gpu(int device, CUdevice* dev) {
  HAP_CU_CHECK(driver().device_get(dev, device));
  CUdevResource whole{};
  HAP_CU_CHECK(driver().device_get_dev_resource(*dev, &whole, CU_DEV_RESOURCE_TYPE_SM));
  return whole;
}

}  // namespace

SmGranularity sm_granularity(int device) {
  check_device(device);
  CUdevice dev = 0;
  return granularity_of(whole_gpu(device, &dev));
}

const GreenContextInfo& enter_green_context(int device, const std::vector<int>& asked, int group) {
  check_device(device);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  HAP_CHECK(s.info.device < 0, "cuda:", device,
            ": a green context is already in effect (on cuda:", s.info.device, ")");
  HAP_CHECK(group >= 0 && group < static_cast<int>(asked.size()), "cuda:", device, ": SM group ",
            group, " of ", asked.size());
  const Driver& d = driver();
  // The primary context first, as the driver advises: the green context retains it.
  HAP_CUDA_CHECK(cudaSetDevice(device));
  HAP_CUDA_CHECK(cudaFree(nullptr));
  CUdevice dev = 0;
  const CUdevResource whole = whole_gpu(device, &dev);
  GreenContextInfo info;
  info.device = device;
  info.group = group;
  info.asked = asked;
  info.granularity = granularity_of(whole);
  const std::string name = "cuda:" + std::to_string(device) + " (" + device_description(device) +
                           ", " + std::to_string(info.granularity.total) + " SMs)";
  info.granted = sm_groups(asked, info.granularity, name);
  // Every process splits the whole GPU the same way, group by group in rank order, and keeps its
  // own: the groups of the processes sharing the GPU are disjoint. The driver splits only a
  // device's, a context's or a green context's resource, not what a split returned: each
  // remainder to split again becomes a green context first, whose resource is split (and kept
  // for the life of the process).
  CUdevResource rest = whole;
  CUdevResource mine{};
  std::vector<CUgreenCtx> remainders;
  CUgreenCtx green = nullptr;
  // Where a step below fails, the green contexts made so far are destroyed (errors ignored:
  // the first error is the one reported), so that a failed entry holds no SMs.
  struct Undo {
    const Driver& d;
    std::vector<CUgreenCtx>& remainders;
    CUgreenCtx& green;
    bool done = false;
    ~Undo() {
      if (done) return;
      if (green) d.green_ctx_destroy(green);
      for (CUgreenCtx r : remainders) d.green_ctx_destroy(r);
    }
  } undo{d, remainders, green};
  for (int g = 0; g <= group; ++g) {
    CUdevResource part{};
    CUdevResource remaining{};
    unsigned int groups = 1;
    HAP_CU_CHECK(d.sm_resource_split_by_count(&part, &groups, &rest, &remaining, 0,
                                              static_cast<unsigned int>(info.granted[g])));
    HAP_CHECK(groups == 1, name, ": the driver gave no group of ", info.granted[g],
              " SMs (SM group ", g, " of ", asked.size(), "; ", rest.sm.smCount, " SMs left)");
    mine = part;
    if (g == group) break;
    CUdevResourceDesc remaining_desc = nullptr;
    HAP_CU_CHECK(d.resource_generate_desc(&remaining_desc, &remaining, 1));
    CUgreenCtx holder = nullptr;
    HAP_CU_CHECK(d.green_ctx_create(&holder, remaining_desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    remainders.push_back(holder);
    HAP_CU_CHECK(d.green_ctx_get_dev_resource(holder, &rest, CU_DEV_RESOURCE_TYPE_SM));
  }
  CUdevResourceDesc desc = nullptr;
  HAP_CU_CHECK(d.resource_generate_desc(&desc, &mine, 1));
  HAP_CU_CHECK(d.green_ctx_create(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  CUcontext ctx = nullptr;
  HAP_CU_CHECK(d.ctx_from_green_ctx(&ctx, green));
  HAP_CU_CHECK(d.ctx_set_current(ctx));
  info.sms = static_cast<int>(mine.sm.smCount);
  undo.done = true;
  s.remainders = std::move(remainders);
  s.green = green;
  s.as_context = ctx;
  s.info = std::move(info);
  return s.info;
}

void leave_green_context() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.info.device < 0) return;
  const int device = s.info.device;
  HAP_CUDA_CHECK(cudaDeviceSynchronize());
  s.info = GreenContextInfo{};
  CUgreenCtx green = s.green;
  s.green = nullptr;
  s.as_context = nullptr;
  HAP_CU_CHECK(driver().ctx_set_current(nullptr));
  HAP_CU_CHECK(driver().green_ctx_destroy(green));
  for (CUgreenCtx r : s.remainders) HAP_CU_CHECK(driver().green_ctx_destroy(r));
  s.remainders.clear();
  HAP_CUDA_CHECK(cudaSetDevice(device));  // the primary context current again
}

const GreenContextInfo& green_context() { return state().info; }

bool make_green_context_current(int device) {
  State& s = state();
  if (s.info.device != device || s.as_context == nullptr) return false;
  CUcontext current = nullptr;
  HAP_CU_CHECK(driver().ctx_get_current(&current));
  if (current != s.as_context) HAP_CU_CHECK(driver().ctx_set_current(s.as_context));
  return true;
}

std::string green_context_note() {
  const GreenContextInfo& g = green_context();
  if (g.device < 0) return "";
  std::string groups;
  for (size_t i = 0; i < g.granted.size(); ++i)
    groups += (i ? ", " : "") + std::to_string(g.granted[i]);
  return detail::concat("in a green context of ", g.sms, " of cuda:", g.device, "'s ",
                        g.granularity.total, " SMs (SM group ", g.group, " of ", groups, ")");
}

int current_context_sms() {
  CUcontext current = nullptr;
  HAP_CU_CHECK(driver().ctx_get_current(&current));
  HAP_CHECK(current != nullptr, "no CUDA context is current to this thread");
  CUdevResource r{};
  HAP_CU_CHECK(driver().ctx_get_dev_resource(current, &r, CU_DEV_RESOURCE_TYPE_SM));
  return static_cast<int>(r.sm.smCount);
}

std::vector<int> sm_ids_of_blocks(int device, int blocks) {
  HAP_CHECK(blocks > 0, "sm_ids_of_blocks: ", blocks, " blocks");
  set_device(device);
  int* ids = nullptr;
  HAP_CUDA_CHECK(
      cudaMalloc(reinterpret_cast<void**>(&ids), sizeof(int) * static_cast<size_t>(blocks)));
  std::vector<int> host(static_cast<size_t>(blocks), -1);
  try {
    launch_sm_ids(ids, blocks);
    HAP_CUDA_CHECK(cudaGetLastError());
    HAP_CUDA_CHECK(cudaMemcpy(host.data(), ids, sizeof(int) * host.size(), cudaMemcpyDefault));
  } catch (...) {
    cudaFree(ids);
    throw;
  }
  HAP_CUDA_CHECK(cudaFree(ids));
  return host;
}

}  // namespace hap::cuda
