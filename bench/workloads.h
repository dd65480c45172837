// Allocation patterns shared by the benchmarks: deterministic sequences of alloc/free events that
// look like real jobs, replayed through cudaMalloc/cudaFree by the bench programs.
//
//   training_step   one step of a small transformer: per layer, activations kept for backward,
//                   attention scores that grow with the square of the sequence length, temporaries
//                   freed at once; backward frees in reverse and allocates gradients. A mixed-size
//                   pattern (512 B .. tens of MiB) whose shape changes with the sequence length.
//   growing_buffer  a buffer re-allocated a little larger at every step (a KV cache, a dynamic
//                   batch), with small long-lived allocations pinning the segments between: the
//                   classic way a best-fit cache ends up holding memory it cannot use.
//   random_churn    random sizes (log-uniform 512 B .. 32 MiB) with random lifetimes, about 200 live.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace gpushim_bench {

struct Event {
  bool alloc;      // false: free
  uint32_t slot;   // which live allocation this is (index into the replayer's table)
  uint64_t size;   // for allocs
};

class EventSequence {
 public:
  uint32_t alloc(uint64_t size) {
    const uint32_t slot = next_slot_++;
    events_.push_back({true, slot, size});
    return slot;
  }
  void free(uint32_t slot) { events_.push_back({false, slot, 0}); }
  const std::vector<Event>& events() const { return events_; }
  uint32_t slots() const { return next_slot_; }

 private:
  std::vector<Event> events_;
  uint32_t next_slot_ = 0;
};

// One training step at sequence length `seq` (hidden 256, 8 heads, 6 layers, bf16). Everything it
// allocates it frees, so steps can be repeated.
inline void training_step(EventSequence& s, uint64_t seq) {
  constexpr uint64_t kHidden = 256, kHeads = 8, kLayers = 6, kElem = 2;
  const uint64_t act = seq * kHidden * kElem;
  const uint64_t scores = kHeads * seq * seq * kElem;
  const uint64_t mlp = seq * 4 * kHidden * kElem;
  std::vector<uint32_t> kept;
  const uint32_t input = s.alloc(seq * 8);  // token ids
  for (uint64_t l = 0; l < kLayers; ++l) {
    const uint32_t qkv_tmp = s.alloc(3 * act);
    kept.push_back(s.alloc(act));      // attention input, kept for backward
    kept.push_back(s.alloc(scores));   // softmax output, kept
    const uint32_t stats = s.alloc(kHeads * seq * 4);
    s.free(qkv_tmp);
    kept.push_back(s.alloc(mlp));      // MLP activation, kept
    const uint32_t tmp = s.alloc(mlp);
    s.free(stats);
    s.free(tmp);
    kept.push_back(s.alloc(act));      // layer output
  }
  const uint32_t loss = s.alloc(512);
  s.free(loss);
  // Backward: gradients flow from the last layer; activations die as they are used.
  uint32_t grad = s.alloc(act);
  while (!kept.empty()) {
    const uint32_t g_next = s.alloc(std::max<uint64_t>(act, 512));
    const uint32_t wgrad = s.alloc(kHidden * kHidden * kElem);
    s.free(kept.back());
    kept.pop_back();
    s.free(grad);
    s.free(wgrad);
    grad = g_next;
  }
  s.free(grad);
  s.free(input);
}

// Sequence lengths of a job whose batches are padded to the longest sample: varying every step.
inline std::vector<uint64_t> varying_sequence_lengths(int steps, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint64_t> out;
  for (int i = 0; i < steps; ++i) out.push_back(64 * (1 + rng() % 24));  // 64 .. 1536
  return out;
}

inline EventSequence varying_length_training(int steps, uint32_t seed) {
  EventSequence s;
  for (uint64_t seq : varying_sequence_lengths(steps, seed)) training_step(s, seq);
  return s;
}

inline EventSequence growing_buffer(int steps) {
  EventSequence s;
  uint32_t buffer = s.alloc(1 << 20);
  std::vector<uint32_t> pins;
  for (int i = 1; i <= steps; ++i) {
    pins.push_back(s.alloc(64 << 10));  // long-lived, e.g. per-step metadata
    const uint32_t bigger = s.alloc((1ull << 20) + static_cast<uint64_t>(i) * (768 << 10));
    s.free(buffer);
    buffer = bigger;
  }
  s.free(buffer);
  for (uint32_t p : pins) s.free(p);
  return s;
}

inline EventSequence random_churn(int events, uint32_t seed) {
  EventSequence s;
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> live;
  std::uniform_real_distribution<double> log_size(std::log(512.0), std::log(32.0 * (1 << 20)));
  while (static_cast<int>(s.events().size()) < events) {
    const bool grow = live.size() < 100 || (live.size() < 300 && rng() % 2 == 0);
    if (grow) {
      live.push_back(s.alloc(static_cast<uint64_t>(std::exp(log_size(rng)))));
    } else {
      const size_t i = rng() % live.size();
      s.free(live[i]);
      live[i] = live.back();
      live.pop_back();
    }
  }
  for (uint32_t slot : live) s.free(slot);
  return s;
}

inline std::vector<std::string> workload_names() { return {"varying_length_training", "growing_buffer", "random_churn"}; }

// The workload `name`, or an empty sequence for an unknown name.
inline EventSequence make_workload(const std::string& name, int scale, uint32_t seed) {
  if (name == "varying_length_training") return varying_length_training(scale, seed);
  if (name == "growing_buffer") return growing_buffer(scale);
  if (name == "random_churn") return random_churn(scale * 100, seed);
  return {};
}

}  // namespace gpushim_bench
