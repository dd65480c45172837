// The process's iteration count: what "bytes per iteration" divides by. Counted from explicit
// marks (gpushim_mark_iteration) and from new activations of GPUSHIM_ITERATION_SITE.
#pragma once

#include <atomic>
#include <cstdint>

namespace gpushim {

class IterationCounter {
 public:
  enum Source : unsigned { kMark = 1, kSite = 2 };
  static constexpr unsigned kSources = kMark | kSite;
  // Beside the sources in a trace's checkpoint (format 1.7): the iteration count triggered the
  // checkpoint, at an iteration the site began or at a mark (SitePoint::at_iteration).
  static constexpr unsigned kCheckpointAtSiteIteration = 4;
  static constexpr unsigned kCheckpointAtMark = 8;

  // Returns the count after this iteration.
  uint64_t add(Source source) {
    if ((sources_.load(std::memory_order_relaxed) & source) == 0) sources_.fetch_or(source, std::memory_order_relaxed);
    return count_.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  unsigned sources() const { return sources_.load(std::memory_order_relaxed); }
  // "none", "marks", "site" or "marks+site".
  const char* source_name() const { return source_name(sources()); }
  static const char* source_name(unsigned sources) {
    switch (sources) {
      case kMark: return "marks";
      case kSite: return "site";
      case kMark | kSite: return "marks+site";
      default: return "none";
    }
  }

 private:
  std::atomic<uint64_t> count_{0};
  std::atomic<unsigned> sources_{0};
};

}  // namespace gpushim
