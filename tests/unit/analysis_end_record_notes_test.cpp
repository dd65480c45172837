// The notes that say a trace's figure is the shim's own (its end record), not its events'.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "run_view.h"
#include "test_sizes.h"

namespace gpushim::analysis {
namespace {

trace::TraceEvent event(trace::EventKind kind, uint64_t t_ns, uint64_t addr, uint64_t size) {
  trace::TraceEvent e;
  e.kind = kind;
  e.t_ns = t_ns;
  e.addr = addr;
  e.size = e.requested = size;
  return e;
}

// A trace of device 0 (16 GiB) holding `events`.
TraceData device0_trace(std::vector<trace::TraceEvent> events) {
  TraceData t;
  t.header.start_mono_ns = 1000;
  t.devices = {trace::DeviceInfo{0, 16 * GiB, 0}};
  t.events = std::move(events);
  return t;
}

// Ends `t` with the shim's own figures for device 0, `dropped` events having never reached it.
void end_with(TraceData* t, trace::DeviceTotals totals, uint64_t dropped = 0) {
  t->dropped = dropped;
  trace::EndInfo end;
  end.end_mono_ns = 4000;
  end.events_dropped = dropped;
  totals.ordinal = 0;
  end.devices = {totals};
  t->end = end;
}

const std::string* note_on(const RunView& v, const std::string& what) {
  auto it = std::find_if(v.notes.begin(), v.notes.end(), [&](const std::string& n) { return n.find(what) != n.npos; });
  return it == v.notes.end() ? nullptr : &*it;
}

TEST(EndRecordNotes, FiguresThatRoundAlikeAreGivenInBytes) {
  // A vmm trace of the corpus said "peak reserved 2.6 GiB is the shim's own figure (the trace's end
  // record); its events account for 2.6 GiB": two figures 18 MiB apart that read the same.
  using trace::EventKind;
  const uint64_t events_peak = 2650 * MiB + 18 * MiB, shim_peak = 2650 * MiB;
  TraceData t = device0_trace({event(EventKind::kSegmentMap, 2000, 0x100000000, events_peak),
                               event(EventKind::kAlloc, 2100, 0x100000000, 1 * MiB)});
  trace::DeviceTotals totals;
  totals.peak_reserved = shim_peak;
  totals.reserved = shim_peak;
  end_with(&t, totals);
  RunView v;
  run_from_trace(t, "t.trace", &v);
  const std::string* peak = note_on(v, "peak reserved");
  ASSERT_NE(peak, nullptr);
  EXPECT_EQ(*peak, "device 0: peak reserved 2.6 GiB (" + std::to_string(shim_peak) +
                       " B) is the shim's own figure (the trace's end record); its events account for 2.6 GiB (" +
                       std::to_string(events_peak) + " B)");
  const std::string* at_end = note_on(v, "reserved at the end");
  ASSERT_NE(at_end, nullptr);
  EXPECT_NE(at_end->find("(" + std::to_string(events_peak) + " B)"), std::string::npos) << *at_end;
  // Figures that read apart stay as they read.
  t.end->devices[0].peak_reserved = 1 * GiB;
  RunView far;
  run_from_trace(t, "t.trace", &far);
  ASSERT_NE(note_on(far, "peak reserved"), nullptr);
  EXPECT_EQ(note_on(far, "peak reserved")->find(" B)"), std::string::npos) << *note_on(far, "peak reserved");
}

// A trace whose writer fell behind lost frees: the events then hold allocations the run freed, and
// every reading summed them (a churning program that held nothing at exit read as a 1.1 GiB leak,
// also in diff, merge and the plot). The end record's figures are the shim's own, exact ones.
TEST(EndRecordNotes, WithEventsDroppedTheDeviceFiguresAreTheEndRecords) {
  using trace::EventKind;
  // Two allocations whose frees were dropped, one freed: live 3 MiB by the events, 0 by the shim.
  TraceData t = device0_trace({event(EventKind::kAlloc, 2000, 0x100000000, 1 * MiB),
                               event(EventKind::kAlloc, 2100, 0x100200000, 2 * MiB),
                               event(EventKind::kAlloc, 2200, 0x100400000, 4 * MiB),
                               event(EventKind::kFree, 2300, 0x100400000, 4 * MiB)});
  trace::DeviceTotals totals;
  totals.peak_bytes = 4 * MiB;
  totals.total_allocs = 3;
  totals.total_frees = 3;
  end_with(&t, totals, /*dropped=*/2);
  RunView v;
  run_from_trace(t, "t.trace", &v);
  ASSERT_NE(v.device(0), nullptr);
  const DeviceReport& d = *v.device(0);
  EXPECT_EQ(d.live_bytes, 0u);
  EXPECT_EQ(d.live_count, 0u);
  EXPECT_EQ(d.peak_bytes, 4 * MiB);  // the events: 7 MiB
  EXPECT_EQ(d.total_frees, 3u);
  const std::string* note = note_on(v, "are the shim's own figures");
  ASSERT_NE(note, nullptr);
  EXPECT_NE(note->find("account for live 3.0 MiB, peak 7.0 MiB"), std::string::npos) << *note;
  // Nothing dropped: the events are the figures, whatever the end record says.
  t.dropped = 0;
  t.end->events_dropped = 0;
  RunView whole;
  run_from_trace(t, "t.trace", &whole);
  ASSERT_NE(whole.device(0), nullptr);
  EXPECT_EQ(whole.device(0)->live_bytes, 3 * MiB);
  EXPECT_EQ(note_on(whole, "are the shim's own figures"), nullptr);
}

// An end record that does not add up (the trace reader's fuzzer made one: more allocations live
// than made) is not taken for the device's figures, dropped events or not.
TEST(EndRecordNotes, AnEndRecordThatDoesNotAddUpIsNotTaken) {
  using trace::EventKind;
  TraceData t = device0_trace({event(EventKind::kAlloc, 2000, 0x100000000, 1 * MiB),
                               event(EventKind::kAlloc, 2100, 0x100200000, 2 * MiB)});
  trace::DeviceTotals totals;
  totals.live_count = 9;
  totals.live_bytes = 9 * MiB;
  totals.peak_bytes = 9 * MiB;
  totals.total_allocs = 3;
  end_with(&t, totals, /*dropped=*/1);
  RunView v;
  run_from_trace(t, "t.trace", &v);
  ASSERT_NE(v.device(0), nullptr);
  const DeviceReport& d = *v.device(0);
  EXPECT_EQ(d.live_count, 2u);
  EXPECT_EQ(d.total_allocs, 2u);
  EXPECT_LE(d.live_count, d.total_allocs);
  EXPECT_EQ(d.live_bytes, 3 * MiB);
  EXPECT_NE(note_on(v, "does not add up"), nullptr);
  EXPECT_EQ(note_on(v, "are the shim's own figures"), nullptr);
}

}  // namespace
}  // namespace gpushim::analysis
