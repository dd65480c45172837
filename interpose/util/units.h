// Byte quantities as people write and read them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace gpushim {

// Human form for messages and the summary: "512 B", "1.5 KiB", "12.0 MiB", "3.2 GiB" (binary
// units, one decimal above bytes, up to EiB).
std::string format_bytes(uint64_t bytes);

// Parses a byte quantity such as "8GiB", " 12 MiB ", "512m", "1.5G", "80GB", "4096".
//
// Units (case-insensitive, optional space between number and unit):
//   none, B                      bytes
//   K, Ki, KiB / M, Mi, MiB / G, Gi, GiB / T, Ti, TiB    binary: 2^10, 2^20, 2^30, 2^40
//   KB / MB / GB / TB            decimal (SI): 10^3, 10^6, 10^9, 10^12
// The single-letter forms are binary because that is what Docker, the JVM, Slurm and
// PYTORCH_CUDA_ALLOC_CONF's *_mb knobs mean by them; the two-letter xB forms follow SI so that
// "80GB" means what a GPU data sheet means.
//
// A decimal fraction is allowed with a unit larger than a byte ("1.5GiB" = 1610612736 exactly,
// computed in integers, never through floating point); a fractional result is truncated to a
// whole byte. Fractions of plain bytes ("1.5", "1.5B"), a sign, a missing leading digit (".5G"),
// a trailing dot ("1.G"), more than 18 fraction digits, an empty string, unknown units, trailing
// junk and values above UINT64_MAX are rejected. Leading/trailing whitespace is ignored.
// Returns false and leaves *out untouched on rejection.
bool parse_bytes(std::string_view text, uint64_t* out);

}  // namespace gpushim
