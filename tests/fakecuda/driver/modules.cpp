// Modules and kernels: cuModuleLoadData(Ex), cuModuleLoadFatBinary, cuModuleUnload,
// cuModuleGetFunction, cuFuncGetAttribute, cuLaunchKernel(_ptsz), and the stand-in hook.
//
// The simulated device cannot execute device code. A module keeps a copy of its image (fatbin,
// cubin or PTX) only to answer which kernels it contains: a name is in the module when it occurs
// in the image as a whole NUL- or space-terminated string (ELF string tables of cubins, ".entry"
// lines of PTX; nvcc leaves the fatbins of small programs uncompressed). A launch is validated
// like CUDA's and enqueued on its stream as an op that does nothing, unless a test registered a
// host function standing in for that kernel name (fakecuSetKernelStandIn): then the op calls it,
// in stream order, with a copy of the launch's arguments taken at launch time (kernel arguments are
// passed by value, so the caller may reuse them as soon as cuLaunchKernel returns).
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "driver.h"
#include "../fakecuda.h"

namespace fakecuda {
namespace {

struct Function;

struct Module {
  std::string image;
  std::map<std::string, std::unique_ptr<Function>> functions;
};

struct Function {
  Module* module = nullptr;
  std::string name;
};

struct StandIn {
  fakecudaKernelStandIn fn = nullptr;
  void* user = nullptr;
  std::vector<std::size_t> arg_sizes;
};

// Guarded by State::mu, like all driver state; owned here because nothing else needs it.
std::map<const void*, std::unique_ptr<Module>>& Modules() {
  static auto* m = new std::map<const void*, std::unique_ptr<Module>>;
  return *m;
}
std::map<std::string, StandIn>& StandIns() {
  static auto* m = new std::map<std::string, StandIn>;
  return *m;
}

constexpr std::uint32_t kFatbinMagic = 0xBA55ED50;
constexpr std::uint32_t kFatbinWrapperMagic = 0x466243B1;

// The extent of an image whose length the API does not pass: fatbin header + payload, an ELF
// cubin up to its section headers, or a NUL-terminated PTX text.
CUresult ImageBytes(const void* image, std::string* out) {
  const auto* p = static_cast<const unsigned char*>(image);
  std::uint32_t magic;
  std::memcpy(&magic, p, 4);
  if (magic == kFatbinMagic) {
    std::uint16_t header_size;
    std::uint64_t payload;
    std::memcpy(&header_size, p + 6, 2);
    std::memcpy(&payload, p + 8, 8);
    if (header_size < 16 || payload > (std::uint64_t{1} << 32)) return CUDA_ERROR_INVALID_IMAGE;
    out->assign(reinterpret_cast<const char*>(p), header_size + payload);
    return CUDA_SUCCESS;
  }
  if (std::memcmp(p, "\x7f" "ELF", 4) == 0) {
    if (p[4] != 2) return CUDA_ERROR_INVALID_IMAGE;  // 64-bit cubins only
    std::uint64_t shoff;
    std::uint16_t shentsize, shnum;
    std::memcpy(&shoff, p + 0x28, 8);
    std::memcpy(&shentsize, p + 0x3A, 2);
    std::memcpy(&shnum, p + 0x3C, 2);
    std::uint64_t end = shoff + std::uint64_t{shentsize} * shnum;
    if (end > (std::uint64_t{1} << 32)) return CUDA_ERROR_INVALID_IMAGE;
    out->assign(reinterpret_cast<const char*>(p), end);
    return CUDA_SUCCESS;
  }
  const char* text = static_cast<const char*>(image);
  if (std::strstr(text, ".version") != nullptr || std::strstr(text, ".entry") != nullptr) {
    out->assign(text);
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_IMAGE;
}

bool ImageHasKernel(const std::string& image, const std::string& name) {
  for (std::size_t at = image.find(name); at != std::string::npos; at = image.find(name, at + 1)) {
    char before = at == 0 ? '\0' : image[at - 1];
    char after = at + name.size() < image.size() ? image[at + name.size()] : '\0';
    auto boundary = [](char c) { return c == '\0' || c == ' ' || c == '\t' || c == '\n' || c == '(' || c == '.'; };
    if (boundary(before) && boundary(after)) return true;
  }
  return false;
}

CUresult LoadModule(CUmodule* module, const void* image) {
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = GetState();
  std::lock_guard lk(s.mu);
  Context* ctx = nullptr;
  if (CUresult r = CurrentContext(s, &ctx); r != CUDA_SUCCESS) return r;
  auto m = std::make_unique<Module>();
  // The fatbin wrapper that nvcc emits (what __cudaRegisterFatBinary receives) points at the fatbin.
  std::uint32_t magic;
  std::memcpy(&magic, image, 4);
  if (magic == kFatbinWrapperMagic) {
    const void* data;
    std::memcpy(&data, static_cast<const char*>(image) + 8, sizeof(data));
    image = data;
  }
  if (CUresult r = ImageBytes(image, &m->image); r != CUDA_SUCCESS) return r;
  *module = reinterpret_cast<CUmodule>(m.get());
  Modules()[m.get()] = std::move(m);
  return CUDA_SUCCESS;
}

Module* FindModule(CUmodule h) {
  auto it = Modules().find(h);
  return it == Modules().end() ? nullptr : it->second.get();
}

Function* FindFunction(CUfunction h) {
  for (auto& [key, module] : Modules()) {
    for (auto& [name, fn] : module->functions) {
      if (reinterpret_cast<CUfunction>(fn.get()) == h) return fn.get();
    }
  }
  return nullptr;
}

// Limits of an H100 (cuDeviceGetAttribute reports the same).
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockDim[3] = {1024, 1024, 64};
constexpr unsigned kMaxGridDim[3] = {2147483647u, 65535, 65535};
constexpr unsigned kMaxStaticSharedPerBlock = 48 * 1024;

}  // namespace

CUresult PrepareKernelOp(State& s, CUfunction f, const unsigned grid[3], const unsigned block[3],
                         unsigned shared_bytes, void** kernelParams, void** extra, std::function<void()>* out) {
  (void)s;  // held by the caller: the module and stand-in tables below are guarded by it
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (kernelParams != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long threads = 1;
  for (int i = 0; i < 3; ++i) {
    if (grid[i] == 0 || block[i] == 0 || grid[i] > kMaxGridDim[i] || block[i] > kMaxBlockDim[i]) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    threads *= block[i];
  }
  if (threads > kMaxThreadsPerBlock) return CUDA_ERROR_INVALID_VALUE;
  if (shared_bytes > kMaxStaticSharedPerBlock) return CUDA_ERROR_INVALID_VALUE;
  Function* fn = FindFunction(f);
  if (fn == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // Every kernel keeps its stream busy a while (FAKECUDA_KERNEL_US), before its stand-in runs.
  const unsigned kernel_us = GetConfig().kernel_us;
  auto busy = [kernel_us] {
    if (kernel_us != 0) std::this_thread::sleep_for(std::chrono::microseconds(kernel_us));
  };
  *out = busy;
  auto it = StandIns().find(fn->name);
  if (it == StandIns().end()) return CUDA_SUCCESS;
  const StandIn& stand_in = it->second;
  if (kernelParams == nullptr && !stand_in.arg_sizes.empty()) return CUDA_ERROR_INVALID_VALUE;
  // Arguments are copied now: they are passed by value.
  auto storage = std::make_shared<std::vector<std::vector<unsigned char>>>();
  for (std::size_t i = 0; i < stand_in.arg_sizes.size(); ++i) {
    const auto* arg = static_cast<const unsigned char*>(kernelParams[i]);
    storage->emplace_back(arg, arg + stand_in.arg_sizes[i]);
  }
  fakecudaLaunchDims dims{};
  for (int i = 0; i < 3; ++i) {
    dims.grid[i] = grid[i];
    dims.block[i] = block[i];
  }
  dims.shared_bytes = shared_bytes;
  *out = DeviceWork([fnp = stand_in.fn, user = stand_in.user, storage, dims, busy] {
    busy();
    std::vector<void*> args;
    for (auto& a : *storage) args.push_back(a.data());
    fnp(args.data(), &dims, user);
  });
  return CUDA_SUCCESS;
}

namespace {

CUresult LaunchKernel(CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shared_bytes,
                      CUstream hStream, void** kernelParams, void** extra, bool per_thread) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  std::function<void()> run;
  if (CUresult r = PrepareKernelOp(s, f, grid, block, shared_bytes, kernelParams, extra, &run); r != CUDA_SUCCESS) {
    return r;
  }
  Stream* st = nullptr;
  if (CUresult r = ResolveStream(s, hStream, per_thread, &st, "cuLaunchKernel"); r != CUDA_SUCCESS) return r;
  SubmitOptions opts;
  opts.replayable = true;  // captured launches become graph nodes that launch again on replay
  return Submit(s, st, std::move(run), std::move(opts));
}

}  // namespace
}  // namespace fakecuda

using namespace fakecuda;

CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) { return LoadModule(module, image); }

CUresult CUDAAPI cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int numOptions,
                                    CUjit_option* options, void** optionValues) {
  if (numOptions > 0 && (options == nullptr || optionValues == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  return LoadModule(module, image);  // JIT options only steer compilation, which is not simulated
}

CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) { return LoadModule(module, fatCubin); }

CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  auto it = Modules().find(hmod);
  if (it == Modules().end()) return CUDA_ERROR_INVALID_HANDLE;
  Modules().erase(it);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (CUresult r = CheckInitialized(s); r != CUDA_SUCCESS) return r;
  Module* m = FindModule(hmod);
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  auto& slot = m->functions[name];
  if (slot == nullptr) {
    if (!ImageHasKernel(m->image, name)) {
      m->functions.erase(name);
      return CUDA_ERROR_NOT_FOUND;
    }
    slot = std::make_unique<Function>();
    slot->module = m;
    slot->name = name;
  }
  *hfunc = reinterpret_cast<CUfunction>(slot.get());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncGetAttribute(int* pi, CUfunction_attribute attrib, CUfunction hfunc) {
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (FindFunction(hfunc) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // What a small kernel compiled for sm_90 reports.
  switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = static_cast<int>(kMaxThreadsPerBlock); return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *pi = 0; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *pi = 0; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *pi = 0; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 16; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *pi = 90; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = 90; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: *pi = 0; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = static_cast<int>(kMaxStaticSharedPerBlock); return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *pi = -1; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra) {
  const unsigned grid[3] = {gridDimX, gridDimY, gridDimZ}, block[3] = {blockDimX, blockDimY, blockDimZ};
  return LaunchKernel(f, grid, block, sharedMemBytes, hStream, kernelParams, extra, false);
}

CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                     unsigned int sharedMemBytes, CUstream hStream, void** kernelParams,
                                     void** extra) {
  const unsigned grid[3] = {gridDimX, gridDimY, gridDimZ}, block[3] = {blockDimX, blockDimY, blockDimZ};
  return LaunchKernel(f, grid, block, sharedMemBytes, hStream, kernelParams, extra, true);
}

CUresult fakecuSetKernelStandIn(const char* name, fakecudaKernelStandIn fn, void* user, const size_t* arg_sizes,
                                int num_args) {
  if (name == nullptr || num_args < 0 || (num_args > 0 && arg_sizes == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  State& s = GetState();
  std::lock_guard lk(s.mu);
  if (fn == nullptr) {
    StandIns().erase(name);
    return CUDA_SUCCESS;
  }
  StandIns()[name] = StandIn{fn, user, std::vector<std::size_t>(arg_sizes, arg_sizes + num_args)};
  return CUDA_SUCCESS;
}
