// One trampoline per exported function: a load of its slot and a jump, so the call arrives in the
// core with every argument register and the caller's return address intact (the core attributes
// allocations to that return address, and its stacks must not show the front). An empty slot
// (the core not loaded yet) goes to gpushim_front_lazy, which saves the argument registers, asks
// gpushim_front_resolve (front_loader.cpp) for the target, restores them and jumps there.
// Assembly because the front knows names, not signatures: it forwards any call unchanged.
#include "front/front.h"

#if defined(__x86_64__)
// The index travels in %r11, which no calling convention uses for arguments.
#define GPUSHIM_FRONT_SYMBOL(index, name)                                  \
  asm(".text\n"                                                            \
      ".globl " #name "\n"                                                 \
      ".type " #name ", @function\n"                                       \
      ".p2align 4\n" #name ":\n"                                           \
      ".cfi_startproc\n"                                                   \
      "  movq gpushim_front_slots+8*" #index "(%rip), %r11\n"              \
      "  testq %r11, %r11\n"                                               \
      "  je 1f\n"                                                          \
      "  jmp *%r11\n"                                                      \
      "1:\n"                                                               \
      "  movl $" #index ", %r11d\n"                                        \
      "  jmp gpushim_front_lazy\n"                                         \
      ".cfi_endproc\n"                                                     \
      ".size " #name ", .-" #name "\n");
#include "front_symbols.inc"

// Entered by a jump with the caller's frame as the trampoline found it (%rsp = 8 mod 16). Saves
// the six integer argument registers, %rax (the vector-register count of a variadic call) and
// %xmm0-7, calls gpushim_front_resolve(index) on an aligned stack, restores them, jumps.
asm(R"(
  .text
  .type gpushim_front_lazy, @function
  .p2align 4
gpushim_front_lazy:
  .cfi_startproc
  pushq %rbp
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %rbp, 0
  movq %rsp, %rbp
  .cfi_def_cfa_register %rbp
  pushq %rdi
  pushq %rsi
  pushq %rdx
  pushq %rcx
  pushq %r8
  pushq %r9
  pushq %rax
  subq $136, %rsp
  movdqu %xmm0, 0(%rsp)
  movdqu %xmm1, 16(%rsp)
  movdqu %xmm2, 32(%rsp)
  movdqu %xmm3, 48(%rsp)
  movdqu %xmm4, 64(%rsp)
  movdqu %xmm5, 80(%rsp)
  movdqu %xmm6, 96(%rsp)
  movdqu %xmm7, 112(%rsp)
  movl %r11d, %edi
  call gpushim_front_resolve
  movq %rax, %r11
  movdqu 0(%rsp), %xmm0
  movdqu 16(%rsp), %xmm1
  movdqu 32(%rsp), %xmm2
  movdqu 48(%rsp), %xmm3
  movdqu 64(%rsp), %xmm4
  movdqu 80(%rsp), %xmm5
  movdqu 96(%rsp), %xmm6
  movdqu 112(%rsp), %xmm7
  addq $136, %rsp
  popq %rax
  popq %r9
  popq %r8
  popq %rcx
  popq %rdx
  popq %rsi
  popq %rdi
  popq %rbp
  .cfi_def_cfa %rsp, 8
  jmp *%r11
  .cfi_endproc
  .size gpushim_front_lazy, .-gpushim_front_lazy
)");

#elif defined(__aarch64__)
// The index travels in x17 (IP1), the slot in x16 (IP0): the intra-procedure-call scratch
// registers, which no argument uses.
#define GPUSHIM_FRONT_SYMBOL(index, name)                                  \
  asm(".text\n"                                                            \
      ".globl " #name "\n"                                                 \
      ".type " #name ", %function\n"                                       \
      ".p2align 4\n" #name ":\n"                                           \
      ".cfi_startproc\n"                                                   \
      "  adrp x16, gpushim_front_slots\n"                                  \
      "  add x16, x16, :lo12:gpushim_front_slots\n"                        \
      "  ldr x16, [x16, #8*" #index "]\n"                                  \
      "  cbz x16, 1f\n"                                                    \
      "  br x16\n"                                                         \
      "1:\n"                                                               \
      "  mov x17, #" #index "\n"                                           \
      "  b gpushim_front_lazy\n"                                           \
      ".cfi_endproc\n"                                                     \
      ".size " #name ", .-" #name "\n");
#include "front_symbols.inc"

// Saves x0-x8 (x8: the indirect-result register) and q0-q7 around gpushim_front_resolve(index).
asm(R"(
  .text
  .type gpushim_front_lazy, %function
  .p2align 4
gpushim_front_lazy:
  .cfi_startproc
  stp x29, x30, [sp, #-224]!
  .cfi_def_cfa_offset 224
  .cfi_offset 29, -224
  .cfi_offset 30, -216
  mov x29, sp
  stp x0, x1, [sp, #16]
  stp x2, x3, [sp, #32]
  stp x4, x5, [sp, #48]
  stp x6, x7, [sp, #64]
  str x8, [sp, #80]
  stp q0, q1, [sp, #96]
  stp q2, q3, [sp, #128]
  stp q4, q5, [sp, #160]
  stp q6, q7, [sp, #192]
  mov x0, x17
  bl gpushim_front_resolve
  mov x16, x0
  ldp q6, q7, [sp, #192]
  ldp q4, q5, [sp, #160]
  ldp q2, q3, [sp, #128]
  ldp q0, q1, [sp, #96]
  ldr x8, [sp, #80]
  ldp x6, x7, [sp, #64]
  ldp x4, x5, [sp, #48]
  ldp x2, x3, [sp, #32]
  ldp x0, x1, [sp, #16]
  ldp x29, x30, [sp], #224
  .cfi_def_cfa_offset 0
  .cfi_restore 29
  .cfi_restore 30
  br x16
  .cfi_endproc
  .size gpushim_front_lazy, .-gpushim_front_lazy
)");
#else
#error "the front's trampolines exist for x86-64 and aarch64 only"
#endif
