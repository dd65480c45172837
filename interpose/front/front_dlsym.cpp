// dlsym, interposed: a handle-scoped lookup never sees LD_PRELOAD, and it is how libcudart (and
// every library carrying a static copy of it) reaches the driver: dlopen("libcuda.so.1") then
// dlsym(handle, "cuGetProcAddress_v2"). Python's ctypes reaches the runtime the same way. On a
// libcuda or libcudart handle, names we hook resolve to our hooks (hooks/substitution.cpp).
//
// RTLD_DEFAULT and RTLD_NEXT mean "relative to the caller": glibc finds the caller from dlsym's
// return address. Forwarding them with an ordinary call would make libgpushim the caller, so
// RTLD_NEXT would search the objects after the shim (design-notes §2: LLVM OpenMP's tool loader
// then loops during `import torch`) and RTLD_DEFAULT would lose the caller's local scope. Those
// two are therefore forwarded with a tail jump (a few instructions of assembly below): glibc sees
// the original caller and answers exactly as if the shim were not there. Only explicit handles,
// whose answer does not depend on the caller, run through C++.
//
// The hook never recurses: it reaches glibc's dlsym through a pointer taken with dlvsym, and the
// substitution makes no dlsym call of its own. It lives in the front (never instrumented: a
// sanitizer runtime's start-up calls dlsym before its shadow memory exists), and loads the core
// only for a name we hook.
#include <dlfcn.h>

#include "front/front.h"

// Used by the assembly below; hidden, so the jumps bind inside this library. gpushim_real_dlsym_fn
// holds glibc's dlsym once resolved.
extern "C" {
__attribute__((visibility("hidden"))) void* gpushim_real_dlsym_fn = nullptr;

__attribute__((visibility("hidden"))) void* gpushim_resolve_real_dlsym() {
  void* fn = gpushim::front::real_dlsym_function();
  __atomic_store_n(&gpushim_real_dlsym_fn, fn, __ATOMIC_RELEASE);
  return fn;
}

__attribute__((visibility("hidden"))) void* gpushim_dlsym_with_handle(void* handle, const char* name) {
  void* found = gpushim::front::real_dlsym(handle, name);
  // Only names we hook can be substituted; everything else (every lookup of a program that never
  // touches CUDA) returns without loading the core.
  if (found == nullptr || name == nullptr || name[0] != 'c' || name[1] != 'u') return found;
  // Our own trampoline (a lookup on the program's handle, or on ours): it leads to the hook already.
  if (!gpushim::front::is_exported_function(name) || gpushim::front::is_own_address(found)) return found;
  const GpushimCoreSubstitute substitute = gpushim::front::load_core();
  // A lookup the load made and failed (a front without its core) must not show through this one,
  // which succeeded.
  (void)dlerror();
  return substitute != nullptr ? substitute(name, found) : found;
}
}

#if defined(__x86_64__)
// dlsym(handle, name): handle in %rdi, name in %rsi.
asm(R"(
  .text
  .globl dlsym
  .type dlsym, @function
  .p2align 4
dlsym:
  .cfi_startproc
  testq %rdi, %rdi                      # RTLD_DEFAULT
  je 1f
  cmpq $-1, %rdi                        # RTLD_NEXT
  je 1f
  jmp gpushim_dlsym_with_handle
1:
  movq gpushim_real_dlsym_fn(%rip), %rax
  testq %rax, %rax
  je 2f
  jmp *%rax                             # tail jump: glibc sees our caller's return address
2:
  pushq %rdi                            # first call: resolve glibc's dlsym, keeping the arguments
  .cfi_adjust_cfa_offset 8
  pushq %rsi
  .cfi_adjust_cfa_offset 8
  subq $8, %rsp                         # 16-byte alignment for the call
  .cfi_adjust_cfa_offset 8
  call gpushim_resolve_real_dlsym
  addq $8, %rsp
  .cfi_adjust_cfa_offset -8
  popq %rsi
  .cfi_adjust_cfa_offset -8
  popq %rdi
  .cfi_adjust_cfa_offset -8
  jmp *%rax
  .cfi_endproc
  .size dlsym, .-dlsym
)");
#elif defined(__aarch64__)
// dlsym(handle, name): handle in x0, name in x1, return address in x30.
asm(R"(
  .text
  .globl dlsym
  .type dlsym, %function
  .p2align 4
dlsym:
  .cfi_startproc
  cbz x0, 1f                            // RTLD_DEFAULT
  cmn x0, #1                            // RTLD_NEXT
  b.eq 1f
  b gpushim_dlsym_with_handle
1:
  adrp x16, gpushim_real_dlsym_fn
  ldr x16, [x16, :lo12:gpushim_real_dlsym_fn]
  cbz x16, 2f
  br x16                                // tail jump: x30 still holds our caller's return address
2:
  stp x29, x30, [sp, #-32]!
  .cfi_def_cfa_offset 32
  .cfi_offset 29, -32
  .cfi_offset 30, -24
  mov x29, sp
  stp x0, x1, [sp, #16]
  bl gpushim_resolve_real_dlsym
  mov x16, x0
  ldp x0, x1, [sp, #16]
  ldp x29, x30, [sp], #32
  .cfi_def_cfa_offset 0
  .cfi_restore 29
  .cfi_restore 30
  br x16
  .cfi_endproc
  .size dlsym, .-dlsym
)");
#else
#error "the front's dlsym exists for x86-64 and aarch64 only"
#endif
