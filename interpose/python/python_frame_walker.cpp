#include "python/python_frame_walker.h"

#include "python/python_memory.h"

namespace gpushim {
namespace {

// A chain longer than this is either absurdly deep recursion or corrupt: stop either way.
constexpr size_t kMaxSteps = 4096;

int32_t clamp_offset(int64_t v) {
  if (v < 0) return -1;
  return v > INT32_MAX ? INT32_MAX : static_cast<int32_t>(v);
}

}  // namespace

size_t walk_python_frames(const PythonRuntime& rt, PyFrameRef* out, size_t max) {
  const PythonLayout& L = *rt.layout;
  if (max == 0 || rt.is_finalizing()) return 0;
  const auto tstate = reinterpret_cast<uintptr_t>(rt.this_thread_state());
  if (!py_pointer_plausible(tstate)) return 0;
  uintptr_t frame = py_load<uintptr_t>(tstate + L.tstate_frame);
  if (L.cframe_current >= 0) {
    if (!py_pointer_plausible(frame)) return 0;
    frame = py_load<uintptr_t>(frame + L.cframe_current);
  }
  const bool frame_objects = L.model == PyFrameModel::kFrameObject;
  size_t n = 0;
  bool chain_ended = false;
  for (size_t steps = 0; n < max && steps < kMaxSteps; ++steps, frame = py_load<uintptr_t>(frame + L.frame_previous)) {
    if (frame == 0) {
      chain_ended = true;
      break;
    }
    if (!py_pointer_plausible(frame)) break;
    const int owner = L.frame_owner >= 0 ? py_load<int8_t>(frame + L.frame_owner) : -1;
    // 3.12+: the C entry frame of an eval call separates the frames of two native eval calls.
    if (owner == L.owner_cstack && L.owner_cstack >= 0) {
      if (n > 0) out[n - 1].ends_eval_call = true;
      continue;
    }
    const uintptr_t code = py_load<uintptr_t>(frame + L.frame_code);
    if (!py_pointer_plausible(code) || py_load<uintptr_t>(code + kPyObjectType) != rt.code_type) break;
    const bool is_entry = L.frame_is_entry >= 0 && py_load<uint8_t>(frame + L.frame_is_entry) != 0;
    int32_t offset;
    if (frame_objects) {
      const int lasti = py_load<int>(frame + L.frame_position);
      offset = lasti < 0 ? -1 : clamp_offset(static_cast<int64_t>(lasti) * L.lasti_scale);
    } else {
      const uintptr_t instr = py_load<uintptr_t>(frame + L.frame_position);
      const int64_t delta = static_cast<int64_t>(instr - (code + L.code_adaptive));
      // A frame still running its prologue (before RESUME) is not visible to Python either.
      const int first_traceable = py_load<int>(code + L.code_firsttraceable);
      if (owner != L.owner_generator && delta < static_cast<int64_t>(first_traceable) * 2) {
        if (is_entry && n > 0) out[n - 1].ends_eval_call = true;
        continue;
      }
      offset = clamp_offset(delta);
    }
    PyFrameRef& f = out[n++];
    f.code = code;
    f.frame = frame;
    f.byte_offset = offset;
    f.ends_eval_call = frame_objects || is_entry;
  }
  if (chain_ended && n > 0) out[n - 1].ends_eval_call = true;
  return n;
}

namespace {

// Calls fn(frame) for each frame of the thread's chain, innermost first, until it returns false.
template <typename Fn>
void for_each_frame(const PythonRuntime& rt, uintptr_t tstate, Fn&& fn) {
  const PythonLayout& L = *rt.layout;
  if (!py_pointer_plausible(tstate)) return;
  uintptr_t frame = py_load<uintptr_t>(tstate + L.tstate_frame);
  if (L.cframe_current >= 0) {
    if (!py_pointer_plausible(frame)) return;
    frame = py_load<uintptr_t>(frame + L.cframe_current);
  }
  for (size_t steps = 0; steps < kMaxSteps && py_pointer_plausible(frame) && fn(frame);
       ++steps, frame = py_load<uintptr_t>(frame + L.frame_previous)) {
  }
}

}  // namespace

size_t python_frames_running(const PythonRuntime& rt, uintptr_t tstate, uintptr_t code, size_t max) {
  size_t n = 0;
  for_each_frame(rt, tstate, [&](uintptr_t frame) {
    n += py_load<uintptr_t>(frame + rt.layout->frame_code) == code;
    return n < max;
  });
  return n;
}

uintptr_t python_outermost_frame_running(const PythonRuntime& rt, uintptr_t tstate, uintptr_t code) {
  uintptr_t outermost = 0;
  for_each_frame(rt, tstate, [&](uintptr_t frame) {
    if (py_load<uintptr_t>(frame + rt.layout->frame_code) == code) outermost = frame;
    return true;
  });
  return outermost;
}

size_t read_python_arguments(const PythonRuntime& rt, const PyFrameRef& f, uintptr_t* out, size_t max) {
  const PythonLayout& L = *rt.layout;
  const int argc = py_load<int>(f.code + L.code_argcount);
  size_t n = 0;
  for (; n < max && static_cast<int>(n) < argc; ++n) {
    const uintptr_t obj = py_load<uintptr_t>(f.frame + L.frame_localsplus + 8 * n);
    out[n] = obj;
    if (!py_pointer_plausible(obj)) continue;
    // A temporary argument (train_step(1000 + j)) is freed when the call returns, and the next
    // call's temporary often gets its address: numbers are told apart by value as well. Reads stay
    // inside the object: a float's value, an int's size word and first digit (both layouts).
    const uintptr_t type = py_load<uintptr_t>(obj + kPyObjectType);
    uint64_t value = 0;
    if (type != 0 && type == rt.float_type)
      value = py_load<uint64_t>(obj + 16);
    else if (type != 0 && type == rt.long_type)
      value = py_load<uint64_t>(obj + 16) * 0x9E3779B97F4A7C15ull ^ py_load<uint32_t>(obj + 24);
    out[n] ^= value * 0xBF58476D1CE4E5B9ull;
  }
  return n;
}

}  // namespace gpushim
