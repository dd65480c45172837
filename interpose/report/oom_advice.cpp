#include "report/oom_advice.h"

#include <cmath>
#include <cstdio>

#include "report/growth_verdict.h"
#include "stacks/frame_roles.h"
#include "util/paths.h"

#include "util/units.h"

namespace gpushim {

namespace {

// "function at file:line" of the first frame of the program's own, or "an unknown site".
std::string site_name(const std::vector<FrameInfo>& frames) {
  const FrameInfo* f = user_frame(frames);
  if (f == nullptr) return "an unknown site";
  std::string where = f->function.empty() ? "??" : f->function;
  if (!f->file.empty()) where += " at " + std::string(base_name(f->file)) + ":" + std::to_string(f->line);
  return where;
}

}  // namespace

std::string oom_growth_hint(const OomReport& o, const GrowthReport& growth) {
  for (const GrowthSuspectReport& g : growth.suspects) {
    if (g.kind != "device" || g.device != o.device || g.first_s > o.t_s) continue;
    std::string rate;
    if (!std::isnan(g.bytes_per_iteration) && g.bytes_per_iteration > 0)
      rate = ", " + format_bytes(static_cast<uint64_t>(g.bytes_per_iteration)) + " per " +
             growth_unit(growth.steps_per_pattern);
    // The run's whole growth overstates what had grown by an early error: up to the error, the
    // fitted rate says how much (an estimate, and said so).
    std::string grown = "+" + format_bytes(g.growth_bytes) + " over the run";
    if (o.t_s < g.last_s && g.bytes_per_s > 0) {
      char when[96];
      std::snprintf(when, sizeof when, " from %.2f s to the error at %.2f s", g.first_s, o.t_s);
      grown = "about +" + format_bytes(static_cast<uint64_t>(g.bytes_per_s * (o.t_s - g.first_s))) + when;
    }
    return "Live memory kept growing at " + site_name(g.frames) + " (" + grown + rate +
           "): that leak, more than any site merely large, is the likely cause; see the growth suspects.";
  }
  return "";
}

std::string oom_advice(const OomReport& o, const std::string& policy) {
  std::string advice;
  auto add = [&](const std::string& s) { advice += (advice.empty() ? "" : " ") + s; };
  // Larger than the device (or the cap) itself: nothing the process frees can make it fit.
  const bool capped = o.limit != 0 && (o.capacity == 0 || o.limit < o.capacity);
  const uint64_t room = capped ? o.limit : o.capacity;
  if (room != 0 && o.requested > room) {
    add("The request alone (" + format_bytes(o.requested) + ") is larger than the " +
        (capped ? "cap GPUSHIM_LIMIT=" + format_bytes(o.limit) : "device (" + format_bytes(o.capacity) + ")") +
        ": no policy can serve it; split the tensor or shrink what makes it (batch size, sequence length).");
    return advice;
  }
  // Fragmentation: enough memory is cached, but no free block is big enough.
  if (o.cached_free >= o.requested && o.largest_free_block < o.requested) {
    add("Reserved-but-free memory (" + format_bytes(o.cached_free) + ") would fit the request, but it is split into pieces "
        "no larger than " + format_bytes(o.largest_free_block) + ": external fragmentation.");
    if (policy == "caching")
      add("Try GPUSHIM_POLICY=vmm, which maps free pieces into one range, or GPUSHIM_MAX_SPLIT to keep large blocks whole.");
  } else if (o.cached_free > o.allocated / 4 && o.cached_free > 0) {
    add("The pool holds " + format_bytes(o.cached_free) + " reserved but free; much of it is small blocks.");
  }
  // What CUDA's own memory pools keep beyond their allocations (their release threshold): held
  // from the driver, against the cap and the device like anything else, and only the program can
  // make them give it back.
  const uint64_t kept = o.cuda_pools_kept;
  if (kept >= o.requested || (kept > 0 && kept >= o.reserved / 8)) {
    add("CUDA's own memory pools keep " + format_bytes(kept) +
        " beyond what is allocated from them: cudaMemPoolTrimTo, or a lower cudaMemPoolAttrReleaseThreshold, "
        "gives it back.");
  }
  // The cap had room for the request's bytes but not for what the pool takes from the driver to
  // serve it (a whole segment under caching, 2 MiB pieces under vmm, the driver's rounding under
  // passthrough): "2.0 MiB requested, 336.0 MiB reserved, cap 350.0 MiB" reads as a refusal with
  // room to spare unless this is said.
  if (o.limit != 0 && o.reserved < o.limit && o.limit - o.reserved >= o.requested &&
      o.largest_free_block < o.requested) {
    const std::string left = format_bytes(o.limit - o.reserved);
    if (policy == "caching")
      add("The cap still had " + left + " of room, enough for the request itself, but the pool takes memory from "
          "the driver in whole segments (requests up to 1 MiB get a GPUSHIM_SMALL_SEGMENT, up to 10 MiB a "
          "GPUSHIM_LARGE_SEGMENT, 20 MiB by default, larger ones a segment of their own rounded to 2 MiB), and this "
          "one's did not fit under the cap: raise the cap by a segment, or lower GPUSHIM_LARGE_SEGMENT.");
    else
      add("The cap still had " + left + " of room, enough for the request itself, but not for the memory the " +
          policy + " policy takes from the driver to serve it (" +
          (policy == "vmm" ? "whole physical pieces, 2 MiB each" : "the driver's own rounding") +
          "): raise the cap by that much.");
  }
  if (o.limit != 0 && o.capacity > o.limit && o.device_free > o.requested) {
    add("The cap GPUSHIM_LIMIT=" + format_bytes(o.limit) + " refused it while the device still had " +
        format_bytes(o.device_free) + " free: raise the cap if this job may use more.");
  }
  if (!o.top_sites.empty() && o.allocated > 0) {
    const SiteReport& top = o.top_sites.front();
    const std::string where = site_name(top.frames);
    // Rounded, not cut (65.56% is 66%), and never 100% for part of it nor 0% for some of it.
    uint64_t pct = (top.live_bytes * 100 + o.allocated / 2) / o.allocated;
    if (pct >= 100 && top.live_bytes < o.allocated) pct = 99;
    if (pct == 0 && top.live_bytes > 0) pct = 1;
    add("The largest live site (" + where + ") holds " + format_bytes(top.live_bytes) + ", " + std::to_string(pct) +
        "% of allocated memory: that is where to save first.");
  }
  if (advice.empty()) add("Live allocations fill the device: reduce what is alive at the peak (batch size, caching).");
  return advice;
}

}  // namespace gpushim
