// Configuration of the simulated CUDA device, read once from the environment.
//
// This header is deliberately free of CUDA types so that the parsers can be unit-tested on their own
// (the test program compiles config.cpp directly).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace fakecuda {

// A few tens of microseconds, as a small training kernel takes on a GPU.
inline constexpr unsigned kDefaultKernelUs = 20;

struct Config {
  // FAKECUDA_DEVICES: number of simulated devices.
  int devices = 1;
  // FAKECUDA_MEM: capacity of each device in bytes.
  std::size_t capacity = std::size_t{16} << 30;
  // FAKECUDA_FAIL_ALLOC: 1-based indices of device-memory allocation calls that fail with
  // CUDA_ERROR_OUT_OF_MEMORY (counted across every device-memory allocation entry point).
  std::set<std::uint64_t> fail_alloc;
  // FAKECUDA_CONTEXT_MEM: bytes charged to a device when its primary context becomes active.
  std::size_t context_mem = 0;
  // FAKECUDA_BROKEN_EVENTS=1: cuEventQuery reports every event complete at once, as a device
  // whose events do not wait for earlier work would. Only to prove that the reuse-integrity
  // stress catches a pool that trusts a wrong answer (tests/e2e/test_caching.py).
  bool broken_events = false;
  // FAKECUDA_KERNEL_US: how long each kernel launch keeps its stream busy, in microseconds (0 to
  // 1000000; at least that long: the stream's worker sleeps). Work queued behind a launch, and
  // the events recorded after it, complete that much later, so a program that launches kernels
  // runs ahead of the device as on a GPU, and memory it frees is still in use for a while.
  unsigned kernel_us = kDefaultKernelUs;
  // FAKECUDA_ALLOC_ORDER=down: device memory is carved from the top of the free address space
  // (last fit), so later allocations lie at lower addresses, as an H200's driver placed a caching
  // pool's large segments. Address order then differs from allocation order, which a replay that
  // invents its own addresses cannot reproduce. Default "up": first fit in address order.
  bool alloc_top_down = false;
};

inline constexpr int kMaxDevices = 64;

// "16GiB", "512MiB", "1G", "4096", "1.5GiB". K/M/G/T with or without "iB" are binary (1024-based);
// "KB"/"MB"/"GB"/"TB" are decimal. Case-insensitive units. nullopt on malformed input or overflow.
std::optional<std::size_t> ParseSize(std::string_view text);

// "3" or "3,7,12" (spaces allowed around numbers). Every entry must be a positive integer.
std::optional<std::set<std::uint64_t>> ParseIndexList(std::string_view text);

// Strict positive integer.
std::optional<long long> ParseInt(std::string_view text);

// Builds a Config from a getenv-like lookup. Invalid values are reported on `err` as lines starting
// with "fakecuda: " and replaced by the default.
using EnvLookup = const char* (*)(const char* name);
Config LoadConfig(EnvLookup lookup, std::string* err);

// The process-wide configuration: read from the real environment on first use, never re-read.
// Diagnostics go to stderr.
const Config& GetConfig();

}  // namespace fakecuda
