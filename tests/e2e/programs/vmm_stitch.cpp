// Data integrity across the vmm policy's remapping, through the real hooks: every byte is written
// with cudaMemcpy from the host and read back the same way, so a block whose virtual range is
// backed by the wrong physical memory, or whose mapping aliases another block, shows up as wrong
// bytes. Runs under any policy; only the vmm policy remaps.
//
//   stitch: ten 20 MiB blocks, each with its own pattern; the even ones are freed, so 100 MiB is
//           free but no free range is larger than 20 MiB; then one 100 MiB block. Under
//           GPUSHIM_LIMIT=200MiB no new memory may be created, so the vmm policy has to remap the
//           freed chunks into one range (a stitch).
//   grow:   a live 20 MiB block, then a 30 MiB block that is freed and followed by a 50 MiB
//           request: the vmm policy extends the free block where it is by the 20 MiB it lacks.
//
// Prints one JSON line of what it found; exits 1 on any wrong byte.
// Usage: e2e_vmm_stitch stitch|grow
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace {

constexpr size_t MiB = size_t{1} << 20;
constexpr size_t kChunk = 2 * MiB;  // the vmm policy's mapping unit
constexpr size_t kWordsPerChunk = kChunk / sizeof(uint64_t);

// Word `i` of a block tagged `tag`: both can be read back from any word, so a chunk found in the
// wrong place says where it came from.
uint64_t word(uint64_t tag, uint64_t i) { return tag << 40 | i; }

struct Block {
  void* ptr = nullptr;
  size_t size = 0;
  uint64_t tag = 0;
};

long g_wrong = 0;

// The one host buffer every copy goes through, valid until the next fill() or read(): a fresh
// 20-100 MiB vector per copy was most of the program's time under ASan (its zero fill, element by
// element at -O1 without inlining, and the fresh pages' faults).
uint64_t* host_words(size_t words) {
  static std::unique_ptr<uint64_t[]> buffer;
  static size_t capacity = 0;
  if (words > capacity) {
    buffer = std::make_unique_for_overwrite<uint64_t[]>(words);
    capacity = words;
  }
  return buffer.get();
}

void fill(const Block& b) {
  uint64_t* host = host_words(b.size / sizeof(uint64_t));
  for (size_t i = 0; i < b.size / sizeof(uint64_t); ++i) host[i] = word(b.tag, i);
  CHECK(cudaMemcpy(b.ptr, host, b.size, cudaMemcpyHostToDevice));
}

const uint64_t* read(const void* p, size_t size) {
  uint64_t* host = host_words(size / sizeof(uint64_t));
  CHECK(cudaMemcpy(host, p, size, cudaMemcpyDeviceToHost));
  return host;
}

// Whether the first `size` bytes of `b` still hold its pattern; reports the first wrong word.
bool intact(const Block& b, size_t size) {
  const uint64_t* host = read(b.ptr, size);
  for (size_t i = 0; i < size / sizeof(uint64_t); ++i)
    if (host[i] != word(b.tag, i)) {
      std::fprintf(stderr, "block %p (tag %llu): word %zu holds 0x%llx, expected 0x%llx\n", b.ptr,
                   static_cast<unsigned long long>(b.tag), i, static_cast<unsigned long long>(host[i]),
                   static_cast<unsigned long long>(word(b.tag, i)));
      ++g_wrong;
      return false;
    }
  return true;
}

int count_intact(const std::vector<Block>& blocks) {
  int n = 0;
  for (const Block& b : blocks) n += intact(b, b.size) ? 1 : 0;
  return n;
}

// Chunks of [p, p + size) that hold, whole and unchanged, a chunk of one of the `freed` blocks'
// patterns: memory that was remapped rather than created (created memory starts out as zeros on
// the simulated device, and on a GPU holds nothing of these patterns).
int chunks_from(const void* p, size_t size, const std::vector<Block>& freed) {
  const uint64_t* host = read(p, size);
  int n = 0;
  for (size_t c = 0; c < size / kChunk; ++c) {
    const uint64_t* w = host + c * kWordsPerChunk;
    const uint64_t tag = w[0] >> 40, first = w[0] & ((uint64_t{1} << 40) - 1);
    bool known = first % kWordsPerChunk == 0;
    bool from_freed = false;
    for (const Block& b : freed) from_freed |= b.tag == tag && first < b.size / sizeof(uint64_t);
    for (size_t i = 0; known && i < kWordsPerChunk; ++i) known = w[i] == word(tag, first + i);
    n += known && from_freed ? 1 : 0;
  }
  return n;
}

int stitch() {
  constexpr int kBlocks = 10;
  constexpr size_t kSize = 20 * MiB;
  std::vector<Block> all(kBlocks), live, freed;
  for (int i = 0; i < kBlocks; ++i) {
    all[i] = Block{nullptr, kSize, static_cast<uint64_t>(i + 1)};
    CHECK(cudaMalloc(&all[i].ptr, kSize));
    fill(all[i]);
  }
  for (int i = 0; i < kBlocks; ++i) (i % 2 ? live : freed).push_back(all[i]);
  const int intact_before = count_intact(all);
  for (const Block& b : freed) CHECK(cudaFree(b.ptr));

  // Larger than any free range: served only by remapping the freed chunks into one range.
  Block big{nullptr, 5 * kSize, 100};
  CHECK(cudaMalloc(&big.ptr, big.size));
  const int live_after_stitch = count_intact(live);
  const int remapped = chunks_from(big.ptr, big.size, freed);
  fill(big);
  const bool big_ok = intact(big, big.size);
  const int live_after_write = count_intact(live);
  bool overlap = false;
  for (const Block& b : live) {
    const auto a = reinterpret_cast<uintptr_t>(b.ptr), s = reinterpret_cast<uintptr_t>(big.ptr);
    overlap |= a < s + big.size && s < a + b.size;
  }
  std::printf("{\"blocks\":%d,\"intact_before\":%d,\"live\":%zu,\"live_intact_after_stitch\":%d,"
              "\"chunks\":%zu,\"chunks_remapped_from_freed\":%d,\"big_roundtrip\":%d,"
              "\"live_intact_after_big_write\":%d,\"overlap\":%d}\n",
              kBlocks, intact_before, live.size(), live_after_stitch, big.size / kChunk, remapped, big_ok ? 1 : 0,
              live_after_write, overlap ? 1 : 0);
  for (const Block& b : live) CHECK(cudaFree(b.ptr));
  CHECK(cudaFree(big.ptr));
  return g_wrong || overlap ? 1 : 0;
}

int grow() {
  Block keep{nullptr, 20 * MiB, 1}, first{nullptr, 30 * MiB, 2};
  CHECK(cudaMalloc(&keep.ptr, keep.size));
  CHECK(cudaMalloc(&first.ptr, first.size));
  fill(keep);
  fill(first);
  CHECK(cudaFree(first.ptr));
  // 20 MiB more than the free block: grown where it is, by what it lacks.
  Block grown{nullptr, 50 * MiB, 3};
  CHECK(cudaMalloc(&grown.ptr, grown.size));
  const bool same_address = grown.ptr == first.ptr;
  const bool keep_ok = intact(keep, keep.size);
  // Freed memory holds no promise, but memory extended in place is the same memory: its first
  // 30 MiB still hold what the freed block held.
  const uint64_t* prefix = read(grown.ptr, first.size);
  bool prefix_kept = true;
  for (size_t i = 0; i < first.size / sizeof(uint64_t) && prefix_kept; ++i) prefix_kept = prefix[i] == word(first.tag, i);
  fill(grown);
  const bool grown_ok = intact(grown, grown.size);
  const bool keep_ok_after = intact(keep, keep.size);
  std::printf("{\"same_address\":%d,\"live_intact_after_growth\":%d,\"freed_prefix_kept\":%d,"
              "\"grown_roundtrip\":%d,\"live_intact_after_grown_write\":%d}\n",
              same_address ? 1 : 0, keep_ok ? 1 : 0, prefix_kept ? 1 : 0, grown_ok ? 1 : 0, keep_ok_after ? 1 : 0);
  CHECK(cudaFree(keep.ptr));
  CHECK(cudaFree(grown.ptr));
  return g_wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "stitch") return stitch();
  if (mode == "grow") return grow();
  std::fprintf(stderr, "usage: %s stitch|grow\n", argv[0]);
  return 2;
}
