// An inline function large enough (several KiB) that the range of a copy the linker drops, moved to
// address 0, covers the program's start-up code (dropped_copy/main.cpp says why that matters).
#pragma once
extern volatile int g_sink;
inline void big_inline() {
#define GPUSHIM_X(i) g_sink = g_sink * 3 + (i);
#define GPUSHIM_X10(i) GPUSHIM_X(i) GPUSHIM_X(i + 1) GPUSHIM_X(i + 2) GPUSHIM_X(i + 3) GPUSHIM_X(i + 4) \
  GPUSHIM_X(i + 5) GPUSHIM_X(i + 6) GPUSHIM_X(i + 7) GPUSHIM_X(i + 8) GPUSHIM_X(i + 9)
#define GPUSHIM_X100(i) GPUSHIM_X10(i) GPUSHIM_X10(i + 10) GPUSHIM_X10(i + 20) GPUSHIM_X10(i + 30) \
  GPUSHIM_X10(i + 40) GPUSHIM_X10(i + 50) GPUSHIM_X10(i + 60) GPUSHIM_X10(i + 70) GPUSHIM_X10(i + 80) GPUSHIM_X10(i + 90)
  GPUSHIM_X100(0) GPUSHIM_X100(100) GPUSHIM_X100(200) GPUSHIM_X100(300) GPUSHIM_X100(400)
}
