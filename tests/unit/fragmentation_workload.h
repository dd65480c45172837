// A deterministic allocation trace that fragments a caching allocator, shaped like training with a
// varying sequence length (the case the STAlloc and GMLake papers measure):
//   - persistent weights and gradient buffers, allocated first and kept;
//   - every iteration, per-layer activations whose sizes scale with that iteration's sequence
//     length, so blocks freed by one iteration rarely fit the next one's requests exactly;
//   - temporaries with interleaved lifetimes inside each layer, some activations freed early;
//   - a long-lived cache buffer now and then, allocated mid-iteration and kept for a few
//     iterations, which pins memory in the middle of what would otherwise be free;
//   - small requests (under 1 MiB) throughout.
// A caching pool keeps splitting blocks carved for one sequence length and cannot merge them across
// its segments, so its reserved memory climbs well above the peak allocated; a pool that can remap
// free physical memory need not.
//
// The trace depends only on the options (its own generator, no <random> distributions, whose
// output differs between standard libraries), so unit tests, benchmarks and end-to-end programs
// replay exactly the same sequence. Header-only, no gpushim dependency.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace gpushim::workload {

struct Op {
  enum class Kind : uint8_t { kAlloc, kFree };
  Kind kind = Kind::kAlloc;
  uint32_t id = 0;              // allocation id, dense from 0; a kFree names a live id
  uint64_t size = 0;            // kAlloc: requested bytes
  uint32_t stream = 0;          // 0: the legacy default stream; 1..n: distinct streams
  bool stream_ordered = false;  // cudaMallocAsync / cudaFreeAsync rather than cudaMalloc / cudaFree
};

struct FragmentationOptions {
  uint64_t seed = 1;
  int iterations = 40;
  int layers = 16;
  uint64_t weight_min = 2ull << 20, weight_max = 40ull << 20;
  uint64_t activation_min = 4ull << 20, activation_max = 48ull << 20;  // at sequence scale 1
  double scale_min = 0.3, scale_max = 1.7;                            // sequence-length factor per iteration
  int cache_every = 3;                                                // a long-lived cache buffer every n iterations
  int cache_lifetime = 5;                                             // ... kept this many iterations
  uint64_t cache_min = 16ull << 20, cache_max = 160ull << 20;
  double plain_free_share = 0.3;  // share of blocks allocated and freed with cudaMalloc/cudaFree
};

// splitmix64: tiny, fast and identical everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi] (hi - lo small next to 2^64, so the modulo bias does not matter here).
  uint64_t range(uint64_t lo, uint64_t hi) { return lo + next() % (hi - lo + 1); }
  double unit() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  bool chance(double p) { return unit() < p; }

 private:
  uint64_t s_;
};

class TraceBuilder {
 public:
  TraceBuilder(Rng& rng, double plain_share) : rng_(rng), plain_share_(plain_share) {}
  uint32_t alloc(uint64_t size) {
    Op op;
    op.kind = Op::Kind::kAlloc;
    op.id = next_id_++;
    op.size = size;
    op.stream_ordered = !rng_.chance(plain_share_);
    op.stream = op.stream_ordered ? 1 : 0;
    ordered_.push_back(op.stream_ordered);
    ops_.push_back(op);
    return op.id;
  }
  void free(uint32_t id) {
    Op op;
    op.kind = Op::Kind::kFree;
    op.id = id;
    op.stream_ordered = ordered_[id];
    op.stream = op.stream_ordered ? 1 : 0;
    ops_.push_back(op);
  }
  std::vector<Op> take() { return std::move(ops_); }

 private:
  Rng& rng_;
  double plain_share_;
  uint32_t next_id_ = 0;
  std::vector<bool> ordered_;
  std::vector<Op> ops_;
};

inline std::vector<Op> fragmentation_workload(const FragmentationOptions& o = {}) {
  Rng rng(o.seed);
  TraceBuilder t(rng, o.plain_free_share);
  auto odd = [&](uint64_t lo, uint64_t hi) { return rng.range(lo, hi) / 256 * 256 + 256; };  // not chunk multiples
  auto small = [&] { return rng.range(256, 900 << 10); };
  std::vector<uint32_t> persistent;
  std::vector<uint64_t> act_base(static_cast<size_t>(o.layers));
  for (int l = 0; l < o.layers; ++l) {
    persistent.push_back(t.alloc(odd(o.weight_min, o.weight_max)));
    act_base[static_cast<size_t>(l)] = odd(o.activation_min, o.activation_max);
    if (rng.chance(0.5)) persistent.push_back(t.alloc(small()));
  }
  struct Cache {
    uint32_t id;
    int until;
  };
  std::vector<Cache> caches;
  std::vector<uint32_t> grads;  // gradient buffers, allocated on the first backward pass and kept
  for (int it = 0; it < o.iterations; ++it) {
    const double scale = o.scale_min + (o.scale_max - o.scale_min) * rng.unit();
    auto scaled = [&](uint64_t base) {
      return static_cast<uint64_t>(static_cast<double>(base) * scale) / 256 * 256 + 256;
    };
    // Forward: activations kept for backward; temporaries with interleaved lifetimes.
    std::vector<uint32_t> acts(static_cast<size_t>(o.layers));
    std::vector<uint32_t> early;  // activations freed before backward (recomputed there)
    for (int l = 0; l < o.layers; ++l) {
      const uint64_t a = scaled(act_base[static_cast<size_t>(l)]);
      const uint32_t t1 = t.alloc(a / 2 + rng.range(0, a / 4));
      const uint32_t s1 = t.alloc(small());
      const uint32_t t2 = t.alloc(rng.range(a / 8, a));
      t.free(t1);
      acts[static_cast<size_t>(l)] = t.alloc(a);
      t.free(s1);
      t.free(t2);
      if (!early.empty() && rng.chance(0.5)) {
        t.free(early.back());
        early.pop_back();
      }
      if (rng.chance(0.3)) early.push_back(t.alloc(scaled(act_base[static_cast<size_t>(o.layers - 1 - l)]) / 3));
    }
    for (uint32_t id : early) t.free(id);
    if (o.cache_every > 0 && it % o.cache_every == 0) caches.push_back({t.alloc(odd(o.cache_min, o.cache_max)), it + o.cache_lifetime});
    // Backward: gradient temporaries, activations released in reverse.
    for (int l = o.layers - 1; l >= 0; --l) {
      const uint64_t a = scaled(act_base[static_cast<size_t>(l)]);
      const uint32_t g = t.alloc(rng.range(a / 2, a));
      const uint32_t s = t.alloc(small());
      if (it == 0) grads.push_back(t.alloc(odd(o.weight_min, o.weight_max)));
      t.free(acts[static_cast<size_t>(l)]);
      t.free(g);
      if (rng.chance(0.8)) t.free(s);
      else persistent.push_back(s);  // a small buffer that outlives the step (a logged scalar, say)
    }
    for (size_t i = 0; i < caches.size();) {
      if (caches[i].until <= it) {
        t.free(caches[i].id);
        caches.erase(caches.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  for (const Cache& c : caches) t.free(c.id);
  for (uint32_t id : grads) t.free(id);
  for (uint32_t id : persistent) t.free(id);
  return t.take();
}

}  // namespace gpushim::workload
