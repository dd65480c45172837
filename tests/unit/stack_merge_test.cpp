#include "stacks/stack_merge.h"

#include <gtest/gtest.h>

#include <vector>

#include "stacks/iteration_site.h"
#include "stacks/stack_table.h"

namespace gpushim {
namespace {

// Native "addresses": 1xx other code, 5xx the eval loop, 6xx other interpreter code.
NativeFrameRole role(uint64_t pc) {
  if (pc >= 500 && pc < 600) return NativeFrameRole::kEvalLoop;
  if (pc >= 600 && pc < 700) return NativeFrameRole::kInterpreter;
  return NativeFrameRole::kOther;
}

std::vector<uint64_t> merge(const std::vector<uint64_t>& native, const std::vector<PythonStackWord>& py,
                            size_t max_native = 100, size_t max_python = 100) {
  std::vector<uint64_t> out(max_native + max_python);
  out.resize(interleave_python_frames(native.data(), native.size(), py.data(), py.size(), role, max_native, max_python,
                                      out.data()));
  return out;
}

uint64_t P(uint32_t id) { return make_python_frame(id); }

TEST(InterleavePythonFrames, EachEvalCallTakesItsGroupAndInterpreterFramesCollapse) {
  // cudaMalloc <- ffi <- [eval: f, g] <- ext_module <- [eval: callback] ... (innermost first)
  const std::vector<uint64_t> native = {101, 102, 601, 501, 602, 103, 603, 502, 604, 104};
  const std::vector<PythonStackWord> py = {{P(1), false}, {P(2), true}, {P(3), true}};
  EXPECT_EQ(merge(native, py), (std::vector<uint64_t>{101, 102, P(1), P(2), 103, P(3), 104}));
}

TEST(InterleavePythonFrames, LeftoverPythonFramesGoOutermostInOrder) {
  // The unwinder stopped before the second eval call.
  const std::vector<uint64_t> native = {101, 501, 102};
  const std::vector<PythonStackWord> py = {{P(1), true}, {P(2), false}, {P(3), true}};
  EXPECT_EQ(merge(native, py), (std::vector<uint64_t>{101, P(1), 102, P(2), P(3)}));
  // No native frames at all (no unwinder): the Python stack alone.
  EXPECT_EQ(merge({}, py), (std::vector<uint64_t>{P(1), P(2), P(3)}));
}

TEST(InterleavePythonFrames, BudgetsKeepTheInnermostOfEachKind) {
  // 4 native frames above the Python ones, budget 2: the Python frames still come, in place.
  const std::vector<uint64_t> native = {101, 102, 103, 104, 501, 105};
  const std::vector<PythonStackWord> py = {{P(1), false}, {P(2), true}};
  EXPECT_EQ(merge(native, py, 2, 100), (std::vector<uint64_t>{101, 102, P(1), P(2)}));
  EXPECT_EQ(merge(native, py, 100, 1), (std::vector<uint64_t>{101, 102, 103, 104, P(1), 105}));
}

TEST(InterleavePythonFrames, AnEvalFrameWithNoPythonLeftIsDropped) {
  const std::vector<uint64_t> native = {101, 501, 502, 102};
  const std::vector<PythonStackWord> py = {{P(1), true}};
  EXPECT_EQ(merge(native, py), (std::vector<uint64_t>{101, P(1), 102}));
}

SiteActivation python_at(uintptr_t frame, int64_t pos, std::vector<uintptr_t> args) {
  SiteActivation a;
  a.kind = SiteActivation::kPython;
  a.frame = frame;
  a.position = pos;
  a.nargs = static_cast<uint8_t>(args.size());
  for (size_t i = 0; i < args.size(); ++i) a.args[i] = args[i];
  return a;
}

SiteActivation native_at(int64_t ret) {
  SiteActivation a;
  a.kind = SiteActivation::kNative;
  a.position = ret;
  return a;
}

TEST(IterationSite, PythonActivations) {
  const SiteActivation none;
  // First sight, or the function was absent from the previous allocation's stack.
  EXPECT_TRUE(starts_new_activation(none, python_at(0x100, 10, {1})));
  EXPECT_FALSE(starts_new_activation(python_at(0x100, 10, {1}), none));
  // Later in the same call: same activation, even after an argument was rebound.
  EXPECT_FALSE(starts_new_activation(python_at(0x100, 10, {1}), python_at(0x100, 20, {1})));
  EXPECT_FALSE(starts_new_activation(python_at(0x100, 10, {1}), python_at(0x100, 20, {7})));
  // A loop inside the call allocating again at the same place with the same arguments: same.
  EXPECT_FALSE(starts_new_activation(python_at(0x100, 20, {1}), python_at(0x100, 20, {1})));
  EXPECT_FALSE(starts_new_activation(python_at(0x100, 20, {1}), python_at(0x100, 10, {1})));
  // Back at the same or an earlier place with other arguments: called again.
  EXPECT_TRUE(starts_new_activation(python_at(0x100, 20, {1}), python_at(0x100, 20, {2})));
  EXPECT_TRUE(starts_new_activation(python_at(0x100, 20, {1, 5}), python_at(0x100, 10, {1, 6})));
  // Another frame record: another activation.
  EXPECT_TRUE(starts_new_activation(python_at(0x100, 10, {1}), python_at(0x200, 30, {1})));
  // A native observation before a Python one.
  EXPECT_TRUE(starts_new_activation(native_at(0x500), python_at(0x100, 10, {1})));
}

TEST(IterationSite, NativeActivations) {
  const SiteActivation none;
  EXPECT_TRUE(starts_new_activation(none, native_at(0x500)));
  EXPECT_FALSE(starts_new_activation(native_at(0x500), native_at(0x540)));
  EXPECT_TRUE(starts_new_activation(native_at(0x540), native_at(0x500)));
  EXPECT_TRUE(starts_new_activation(native_at(0x500), native_at(0x500)));  // one allocation per call
  EXPECT_FALSE(starts_new_activation(native_at(0x500), none));
}

}  // namespace
}  // namespace gpushim
