// Whose frame is whose (stacks/frame_roles.h): the user's line leads every printed stack, even
// when a static CUDA runtime or a framework is linked into the same executable.
#include "stacks/frame_roles.h"

#include <gtest/gtest.h>

#include "test_frames.h"

namespace gpushim {
namespace {

TEST(FrameRoles, StaticRuntimeInsideTheExecutableIsPlumbing) {
  // nvcc's default build: the runtime's code is part of the program.
  const char* exe = "/home/me/nvcc_leak";
  const std::vector<FrameInfo> stack = {
      native_frame("libcudart_static_5382377d2d6e3a1f1b1ac3f1a6e2b5f4c1d0e9a8", exe),
      native_frame("libcudart_static_f74e2f2b0f6bde5f0d5f3d2c9e8a7b6c5d4e3f21", exe),
      native_frame("cudaMalloc", exe),
      native_frame("main", exe, "/home/me/nvcc_leak.cu", 18),
      native_frame("__libc_start_main", "/lib/x86_64-linux-gnu/libc.so.6"),
      native_frame("_start", exe),
  };
  EXPECT_EQ(frame_role(stack[0]), FrameRole::kPlumbing);
  EXPECT_EQ(frame_role(stack[1]), FrameRole::kPlumbing);
  EXPECT_EQ(frame_role(stack[2]), FrameRole::kPlumbing);
  EXPECT_EQ(frame_role(native_frame("__cudart1021", exe)), FrameRole::kPlumbing);
  EXPECT_EQ(frame_role(native_frame("cudaMallocAsync_ptsz", exe)), FrameRole::kPlumbing);
  EXPECT_EQ(frame_role(native_frame("cudaError cudaMalloc<float>(float**, unsigned long)", exe)), FrameRole::kPlumbing);
  const FrameInfo* user = user_frame(stack);
  ASSERT_NE(user, nullptr);
  EXPECT_EQ(user->function, "main");
  const ShownFrames shown = frames_to_show(stack, 6);
  ASSERT_FALSE(shown.indices.empty());
  EXPECT_EQ(shown.indices.front(), 3u);
  EXPECT_EQ(shown.library_inside, 0u);  // the runtime is not "library context": never shown
}

TEST(FrameRoles, TheCRuntimesModulesAreToldByFileName) {
  for (const char* m : {"/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2", "libstdc++.so.6",
                        "/usr/lib/x86_64-linux-gnu/libgcc_s.so.1", "/lib/x86_64-linux-gnu/libm.so.6",
                        "/lib/libpthread.so.0", "/lib/libc-2.31.so", "/lib/ld-2.31.so", "/lib/librt.so.1"})
    EXPECT_TRUE(c_runtime_module(m)) << m;
  // Names that only begin like them, and the program itself, keep their lines.
  for (const char* m : {"/opt/app/libcustom.so", "/usr/lib/libmyplugin.so", "/usr/lib/libdlpack.so",
                        "/usr/lib/librtmp.so.1", "/home/u/libc/train", "", "/usr/lib/libmath.so",
                        "/usr/lib/libc-client.so.2007e", "/usr/lib/libldap-2.5.so.0", "/usr/lib/libdl-helper.so"})
    EXPECT_FALSE(c_runtime_module(m)) << m;
}

TEST(FrameRoles, UserFunctionsThatOnlyLookLikeTheRuntimeStayTheUsers) {
  const char* exe = "/home/me/app";
  EXPECT_EQ(frame_role(native_frame("cudaMallocChecked", exe)), FrameRole::kUser);
  EXPECT_EQ(frame_role(native_frame("my_cudaMalloc", exe)), FrameRole::kUser);
  EXPECT_EQ(frame_role(native_frame("allocate_buffers(unsigned long)", exe)), FrameRole::kUser);
}

TEST(FrameRoles, FrameworksLinkedIntoTheProgramAreFrameworkFrames) {
  const char* exe = "/home/me/infer";
  const std::vector<FrameInfo> stack = {
      native_frame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, "
             "CUstream_st*)",
             "/opt/torch/lib/libc10_cuda.so"),
      native_frame("at::native::empty_cuda(c10::ArrayRef<long>)", exe),
      native_frame("at::empty(c10::ArrayRef<long>, c10::TensorOptions)", exe),
      native_frame("cublasLtMatmul", exe),
      native_frame("run_batch(Batch const&)", exe, "/home/me/infer.cpp", 77),
      native_frame("main", exe, "/home/me/infer.cpp", 120),
  };
  EXPECT_EQ(frame_role(stack[0]), FrameRole::kLibrary);
  EXPECT_EQ(frame_role(stack[1]), FrameRole::kLibrary);
  EXPECT_EQ(frame_role(stack[3]), FrameRole::kLibrary);
  const ShownFrames shown = frames_to_show(stack, 6);
  ASSERT_EQ(shown.indices.size(), 2u);
  EXPECT_EQ(stack[shown.indices[0]].function, "run_batch(Batch const&)");
  EXPECT_EQ(shown.library_inside, 4u);
}

TEST(FrameRoles, PythonLineFirstUnderTorch) {
  const std::vector<FrameInfo> stack = {
      native_frame("cudaMallocAsync", "/usr/local/cuda/lib64/libcudart.so.13"),
      native_frame("c10::cuda::CUDACachingAllocator::CudaMallocAsync::mallocAsync(void**, signed char, unsigned long, "
             "CUstream_st*)",
             "/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so"),
      native_frame("at::native::empty_cuda(c10::ArrayRef<long>)", "/venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so"),
      python_frame("linear", "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", 125),
      python_frame("train_step", "/home/me/train.py", 42),
      python_frame("main", "/home/me/train.py", 90),
  };
  const FrameInfo* user = user_frame(stack);
  ASSERT_NE(user, nullptr);
  EXPECT_EQ(user->function, "train_step");
  EXPECT_EQ(frames_to_show(stack, 6).library_inside, 3u);
}

// One Python line, several PyTorch operators: the rows show alike, so each says which folded
// frames, from the user's line inward, tell it from the others: a frame wherever they part.
TEST(FrameRoles, RowsThatShowAlikeAreToldApartByTheFoldedFramesWhereTheyPart) {
  auto stack = [](int layer_line, int optimizer_line) {
    return std::vector<FrameInfo>{
        native_frame("cudaMallocAsync", "/usr/local/cuda/lib64/libcudart.so.13"),
        native_frame("at::native::empty_cuda(c10::ArrayRef<long>)",
                     "/venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so"),
        python_frame("_init_group", "/venv/lib/python3.12/site-packages/torch/optim/adam.py", optimizer_line),
        python_frame("forward", "/venv/lib/python3.12/site-packages/torch/nn/modules/transformer.py", layer_line),
        python_frame("train_step", "/home/me/train.py", 72),
        python_frame("main", "/home/me/train.py", 95),
    };
  };
  // Index 3: the layer's line (nearest the user's), index 2: the optimizer's line.
  const std::vector<FrameInfo> a = stack(954, 178), b = stack(954, 182), c = stack(956, 178);
  std::vector<FrameInfo> elsewhere = stack(954, 178);
  elsewhere[4].line = 80;  // another line of the user's: shows differently, needs nothing
  const auto via = telling_frames({&a, &b, &c, &elsewhere}, 6);
  ASSERT_EQ(via.size(), 4u);
  // a and b share line 954 and part at the optimizer's line; c parts from both at 956. a and c
  // then read "954 -> 178" and "956": never alike.
  EXPECT_EQ(via[0], (std::vector<size_t>{3, 2}));
  EXPECT_EQ(via[1], (std::vector<size_t>{3, 2}));
  EXPECT_EQ(via[2], (std::vector<size_t>{3}));
  EXPECT_TRUE(via[3].empty());
  // Stacks alike through and through have nothing to tell them apart by; a row alone needs nothing.
  const std::vector<FrameInfo> same = stack(954, 178);
  EXPECT_EQ(telling_frames({&a, &same}, 6), (std::vector<std::vector<size_t>>{{}, {}}));
  EXPECT_EQ(telling_frames({&a}, 6), (std::vector<std::vector<size_t>>{{}}));
  // Without a user frame the innermost frames are shown; what tells them apart lies past them.
  std::vector<FrameInfo> lib1 = {native_frame("f", "/usr/lib/libcublas.so.13"), native_frame("g", "/usr/lib/libcublas.so.13"),
                                 native_frame("h", "/usr/lib/libcublas.so.13")};
  std::vector<FrameInfo> lib2 = lib1;
  lib2[2].function = "k";
  EXPECT_EQ(telling_frames({&lib1, &lib2}, 2), (std::vector<std::vector<size_t>>{{2}, {2}}));
}

}  // namespace
}  // namespace gpushim
