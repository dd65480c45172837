#include "stacks/frame_roles.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string_view>

namespace gpushim {
namespace {

std::string_view base(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

bool starts(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }
bool has(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// Native libraries of frameworks and of the runtime under every program, by file name prefix.
constexpr std::string_view kLibraryModules[] = {
    "libpython", "python3", "python2", "libffi", "_ctypes", "libc.so", "libc-", "libstdc++", "libgcc_s", "ld-linux",
    "libpthread", "libdl", "libm.so", "libtorch", "libc10", "libcaffe2", "libshm", "libcublas", "libcudnn",
    "libnccl", "librccl", "libcufft", "libcurand", "libcusparse", "libcusolver", "libnvrtc", "libnvJitLink",
    "libnvToolsExt", "librmm", "libcupy", "libtriton", "libxla", "libjax", "libtensorflow", "libonnxruntime",
    "libllvmlite", "libnumba"};

// Python frameworks a user does not write, wherever they are installed.
constexpr std::string_view kLibraryPackages[] = {"/torch/", "/numba/", "/cupy/", "/cupy_backends/", "/triton/",
                                                 "/nccl/", "/rmm/", "/jax/", "/tensorflow/", "/transformers/",
                                                 "/accelerate/", "/deepspeed/", "/lightning/"};

// Frameworks linked into a program or library (no module of their own to tell them by).
constexpr std::string_view kLibraryNamespaces[] = {"c10::", "at::", "torch::", "caffe2::", "triton::", "cublas",
                                                   "cublasLt", "cudnn", "nccl", "ncclInternal", "rmm::", "cupy"};

// The CUDA runtime's allocation entry points. A static runtime (nvcc's default, -cudart static)
// defines them inside the program or library that links it, beside its internal functions named
// libcudart_static_<hash> and __cudart<n>: those frames are the runtime's, wherever they live.
// Also the runtime header's inline templates (cudaMalloc<T>) compiled into the user's code.
constexpr std::string_view kRuntimeEntryPoints[] = {
    "cudaMalloc", "cudaMallocAsync", "cudaMallocFromPoolAsync", "cudaMallocManaged", "cudaMallocPitch",
    "cudaMalloc3D", "cudaMallocArray", "cudaMalloc3DArray", "cudaMallocMipmappedArray", "cudaMallocHost",
    "cudaHostAlloc", "cudaFree", "cudaFreeAsync", "cudaFreeHost", "cudaGraphAddMemAllocNode", "cudaLaunchKernel",
    "cudaGraphLaunch", "cudaGraphInstantiate", "cudaMemPoolCreate", "cudaDeviceSetMemPool", "cudaMemGetInfo"};

bool static_runtime_function(std::string_view function) {
  if (starts(function, "libcudart_static_") || starts(function, "__cudart")) return true;
  // "cudaMalloc", "cudaMalloc_ptsz", "cudaError cudaMalloc<float>(float**, unsigned long)".
  const size_t open = function.find_first_of("(<");
  std::string_view name = function.substr(0, open);
  if (const size_t space = name.rfind(' '); space != std::string_view::npos) name.remove_prefix(space + 1);
  for (std::string_view suffix : {"_ptsz", "_ptds", "_v2"})
    if (name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix)
      name.remove_suffix(suffix.size());
  for (std::string_view e : kRuntimeEntryPoints)
    if (name == e) return true;
  return false;
}

// By shared-object name: "libc.so.6", or glibc's older "libc-2.31.so".
constexpr std::string_view kCRuntimeModules[] = {"libc", "libm", "libpthread", "libdl", "librt", "ld"};

}  // namespace

bool c_runtime_module(std::string_view module) {
  const std::string_view name = base(module);
  if (starts(name, "ld-linux") || starts(name, "libstdc++.so") || starts(name, "libgcc_s.so")) return true;
  for (std::string_view m : kCRuntimeModules) {
    if (!starts(name, m)) continue;
    const std::string_view rest = name.substr(m.size());
    if (starts(rest, ".so") || starts(rest, "-2.")) return true;
  }
  return false;
}

FrameRole frame_role(const FrameInfo& f) {
  if (f.python) {
    const std::string_view file = f.file;
    if (file.empty()) return FrameRole::kLibrary;
    if (has(file, "/site-packages/") || has(file, "/dist-packages/")) return FrameRole::kLibrary;
    if (starts(file, "<frozen")) return FrameRole::kLibrary;
    // The standard library: .../lib/python3.X/... (Debian's /usr/lib/python3/ holds its packages).
    if (has(file, "/lib/python3") || has(file, "/lib64/python3")) return FrameRole::kLibrary;
    for (std::string_view p : kLibraryPackages)
      if (has(file, p)) return FrameRole::kLibrary;
    return FrameRole::kUser;
  }
  const std::string_view module = base(f.module);
  if (starts(module, "libgpushim") || starts(module, "libcudart") || starts(module, "libcuda.so"))
    return FrameRole::kPlumbing;
  if (static_runtime_function(f.function)) return FrameRole::kPlumbing;
  if (has(f.module, "/site-packages/") || has(f.module, "/dist-packages/")) return FrameRole::kLibrary;
  for (std::string_view m : kLibraryModules)
    if (starts(module, m)) return FrameRole::kLibrary;
  for (std::string_view ns : kLibraryNamespaces)
    if (starts(f.function, ns)) return FrameRole::kLibrary;
  return FrameRole::kUser;
}

bool torch_allocator_frame(const FrameInfo& f) {
  if (f.python) return false;
  return starts(base(f.module), "libc10_cuda") || has(f.function, "CUDACachingAllocator");
}

ShownFrames frames_to_show(const std::vector<FrameInfo>& frames, size_t max) {
  ShownFrames out;
  size_t first = frames.size(), user = frames.size();
  for (size_t i = 0; i < frames.size(); ++i) {
    const FrameRole role = frame_role(frames[i]);
    if (role == FrameRole::kPlumbing) continue;
    if (first == frames.size()) first = i;
    if (role == FrameRole::kUser) {
      user = i;
      break;
    }
  }
  if (user == frames.size()) {  // no user code on the stack: its innermost frames, as they are
    for (size_t i = first; i < frames.size() && out.indices.size() < max; ++i)
      if (frame_role(frames[i]) != FrameRole::kPlumbing) out.indices.push_back(i);
    return out;
  }
  for (size_t i = first; i < user; ++i) out.library_inside += frame_role(frames[i]) != FrameRole::kPlumbing;
  // Context: the user frames that led there (a Python caller of a native helper called through
  // ctypes, say), without the library frames between them (libffi, the interpreter, _start).
  for (size_t i = user; i < frames.size() && out.indices.size() < max; ++i)
    if (frame_role(frames[i]) == FrameRole::kUser) out.indices.push_back(i);
  return out;
}

namespace {

// The same frame as a reader sees it: its name and line, or its module offset where it has none.
bool same_frame(const FrameInfo& a, const FrameInfo& b) {
  if (a.python != b.python || a.function != b.function || a.file != b.file || a.line != b.line || a.module != b.module)
    return false;
  return !a.function.empty() || !a.file.empty() || a.module_offset == b.module_offset;
}

}  // namespace

std::vector<std::vector<size_t>> telling_frames(const std::vector<const std::vector<FrameInfo>*>& stacks, size_t max) {
  const size_t n = stacks.size();
  std::vector<std::vector<size_t>> out(n);
  std::vector<ShownFrames> shown;
  std::vector<std::vector<size_t>> hidden(n);  // the frames not shown, in the order searched
  for (size_t i = 0; i < n; ++i) {
    const std::vector<FrameInfo>& f = *stacks[i];
    shown.push_back(frames_to_show(f, max));
    const std::vector<size_t>& idx = shown.back().indices;
    if (idx.empty()) continue;
    if (shown.back().library_inside > 0) {
      for (size_t k = idx.front(); k-- > 0 && frame_role(f[k]) != FrameRole::kPlumbing;) hidden[i].push_back(k);
    } else {
      for (size_t k = idx.back() + 1; k < f.size(); ++k) hidden[i].push_back(k);
    }
  }
  auto frame_at = [&](size_t row, size_t level) -> const FrameInfo* {
    return level < hidden[row].size() ? &(*stacks[row])[hidden[row][level]] : nullptr;
  };
  auto alike = [&](size_t i, size_t j) {
    const std::vector<size_t>& a = shown[i].indices;
    const std::vector<size_t>& b = shown[j].indices;
    if (a.empty() || a.size() != b.size() || (shown[i].library_inside > 0) != (shown[j].library_inside > 0)) return false;
    for (size_t k = 0; k < a.size(); ++k)
      if (!same_frame((*stacks[i])[a[k]], (*stacks[j])[b[k]])) return false;
    return true;
  };
  // Level by level, rows still alike are split by their frame there; each row that parts from
  // the others at a level is told by its frame at that level.
  std::function<void(std::vector<size_t>, size_t)> split = [&](std::vector<size_t> rows, size_t level) {
    while (rows.size() >= 2) {
      std::vector<std::vector<size_t>> buckets;
      bool any = false;
      for (size_t r : rows) {
        const FrameInfo* f = frame_at(r, level);
        any = any || f != nullptr;
        auto it = std::find_if(buckets.begin(), buckets.end(), [&](const std::vector<size_t>& b) {
          const FrameInfo* g = frame_at(b.front(), level);
          return f == nullptr || g == nullptr ? f == g : same_frame(*f, *g);
        });
        if (it == buckets.end()) buckets.push_back({r});
        else it->push_back(r);
      }
      if (!any) return;  // alike as far as they go: nothing tells them apart
      if (buckets.size() > 1) {
        for (size_t r : rows)
          if (frame_at(r, level) != nullptr) out[r].push_back(hidden[r][level]);
        for (std::vector<size_t>& b : buckets) split(std::move(b), level + 1);
        return;
      }
      ++level;
    }
  };
  std::vector<bool> grouped(n);
  for (size_t i = 0; i < n; ++i) {
    if (grouped[i] || shown[i].indices.empty()) continue;
    std::vector<size_t> group = {i};
    for (size_t j = i + 1; j < n; ++j)
      if (!grouped[j] && alike(i, j)) group.push_back(j), grouped[j] = true;
    split(std::move(group), 0);
  }
  return out;
}

const FrameInfo* user_frame(const std::vector<FrameInfo>& frames) {
  const ShownFrames shown = frames_to_show(frames, 1);
  return shown.indices.empty() ? nullptr : &frames[shown.indices.front()];
}

}  // namespace gpushim
