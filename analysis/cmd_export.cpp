// gpushim-analyze export: a report or trace in the formats other viewers read.
#include <sys/stat.h>

#include <cstdlib>

#include "cli.h"
#include "exports.h"
#include "offline_symbolizer.h"
#include "run_view.h"

namespace gpushim::analysis {
namespace {

int run_export(const Cli& cli) {
  std::string err;
  const std::string format = cli.text("--format");
  const std::string metric = cli.text("--metric");
  const bool lines = cli.has("--lines");
  // An option another format takes would change nothing: said, as for --lines, rather than ignored.
  const bool weighted = format == "folded" || format == "speedscope";
  if (lines && !weighted) return usage_error("export", "--lines is for folded and speedscope");
  if (cli.has("--metric") && !weighted) return usage_error("export", "--metric is for folded and speedscope");
  if (cli.has("--max-events") && format != "memory-viz") return usage_error("export", "--max-events is for memory-viz");
  if (cli.has("--max-points") && format != "perfetto" && format != "perfetto-json" && format != "timeline")
    return usage_error("export", "--max-points is for perfetto, perfetto-json and timeline");
  const std::string path = cli.operands[0];
  // Writing the export over its own input would destroy the trace or report: the same file is
  // told by device and inode (another name, a hard link, a symlink), not by its name.
  const std::string output = cli.text("--output");
  struct stat in_st, out_st;
  if (output != "-" && ::stat(path.c_str(), &in_st) == 0 && ::stat(output.c_str(), &out_st) == 0 &&
      in_st.st_dev == out_st.st_dev && in_st.st_ino == out_st.st_ino) {
    std::fprintf(stderr, "gpushim-analyze export: -o %s is the input %s itself: refusing to overwrite it\n",
                 output.c_str(), path.c_str());
    return 1;
  }
  std::string bytes, torn;
  if (!read_file(path, &bytes, &err, &torn)) {
    std::fprintf(stderr, "gpushim-analyze export: %s\n", err.c_str());
    return 1;
  }
  std::vector<std::string> notes;
  std::string out;
  const bool is_trace = looks_like_trace(bytes);
  if (!torn.empty() && !is_trace) {  // a report cannot be read up to a tear: its JSON is one document
    std::fprintf(stderr, "gpushim-analyze export: %s: gzip data cut short\n", path.c_str());
    return 1;
  }
  if (!torn.empty()) notes.push_back(torn);
  if (is_trace) {
    TraceData trace;
    if (!parse_trace_to_read(bytes, &trace, &err)) {
      std::fprintf(stderr, "gpushim-analyze export: %s: %s\n", path.c_str(), err.c_str());
      return 1;
    }
    bytes.clear();
    if (trace.truncated) notes.push_back(trace.stop_note() + ": exported what it holds");
    if (format == "memory-viz") {
      OfflineSymbolizer sym(trace);
      out = memory_viz_from_trace(trace, sym, cli.count("--max-events"),
                                  &notes);
      for (const std::string& n : sym.notes()) notes.push_back(n);
    } else if (format == "perfetto" || format == "perfetto-json") {
      const size_t points = cli.has("--max-points") ? cli.count("--max-points") : 200000;
      out = format == "perfetto" ? perfetto_proto_from_trace(trace, points) : perfetto_from_trace(trace, points);
    } else {
      RunView run;
      run_from_trace(trace, path, &run);
      if (format == "folded") out = folded_from_run(run, metric != "live", lines);
      else if (format == "speedscope") out = speedscope_from_run(run, metric != "live", lines);
      else out = timeline_json(run, trace_timeline(trace, cli.has("--max-points") ? cli.count("--max-points") : 5000));
    }
  } else {
    ReportFile report;
    if (!parse_report(bytes, &report, &err)) {
      std::fprintf(stderr, "gpushim-analyze export: %s: %s\n", path.c_str(), err.c_str());
      return 1;
    }
    RunView run;
    run_from_report(report, path, &run);
    if (format == "memory-viz") out = memory_viz_from_run(run);
    else if (format == "folded" || format == "speedscope") {
      if (metric == "peak") return usage_error("export", "--metric peak needs a trace (a report knows only live memory)");
      out = format == "folded" ? folded_from_run(run, false, lines) : speedscope_from_run(run, false, lines);
    } else if (format == "perfetto") out = perfetto_proto_from_run(run);
    else if (format == "perfetto-json") out = perfetto_from_run(run);
    else out = timeline_json(run, run.meta.timeline);
  }
  // flamegraph.pl stops at an empty file ("No stack counts found") and draws nothing: say why.
  if (format == "folded" && out.empty())
    notes.push_back(std::string("no site held memory ") + (metric == "live" || !is_trace ? "at the end" : "at a device's peak") +
                    ": the folded file is empty, and flamegraph.pl draws nothing from it");
  for (const std::string& n : notes) std::fprintf(stderr, "gpushim-analyze export: note: %s\n", n.c_str());
  if (!write_output(cli.text("--output"), out, &err)) {
    std::fprintf(stderr, "gpushim-analyze export: %s\n", err.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

const CommandSpec kExportCommand{
    .name = "export",
    .operands = "TRACE|REPORT",
    .min_operands = 1,
    .max_operands = 1,
    .summary = "the run in the formats other viewers read",
    .description = "Writes a report or trace in a format another viewer reads.\n",
    .options =
        {
            {.name = "--format",
             .kind = ValueKind::kChoice,
             .value_name = "FORMAT",
             .help = "what to write:",
             .choices =
                 {
                     {"memory-viz",
                      "A PyTorch memory snapshot pickle: drop it on https://pytorch.org/memory_viz. From a trace: "
                      "\"segments\" is the state at the end (every segment with blocks tiling it exactly), "
                      "\"device_traces\" every alloc, free, segment and OOM event, which the viewer replays "
                      "backwards. Memory CUDA served directly (passthrough, graph capture) appears as one segment "
                      "per allocation, as PyTorch shows cudaMalloc'd memory. From a report: only what is live is "
                      "known, by site and without addresses, so each live site becomes one block in a segment of "
                      "its own, with no history."},
                     {"folded",
                      "Folded stacks (\"outer;...;inner bytes\") for flamegraph.pl, speedscope, inferno. Weight: "
                      "bytes live at the end (reports), or bytes held at the device's peak allocated (traces; "
                      "--metric live for bytes live at the end). A frame is its function (Python: function and "
                      "file); --lines splits it by line. The counts are bytes: tell the viewer so, e.g.\n"
                      "  flamegraph.pl --countname bytes --colors mem --title \"GPU memory\" stacks.folded > mem.svg"},
                     {"speedscope",
                      "The same sites in speedscope's own JSON format (https://www.speedscope.app, or `speedscope "
                      "FILE`): unit \"bytes\", so sizes read as MB, frames with their file (and line with --lines), "
                      "one profile per device."},
                     {"perfetto",
                      "Perfetto's own protobuf trace for https://ui.perfetto.dev (name it *.pftrace): a native heap "
                      "profile per device (\"cuda device N\": every callstack's bytes and allocations, allocated "
                      "and freed, at the device's peak and at the end; the UI's heap profile flame graph), counter "
                      "tracks of allocated, reserved and the cap in bytes, and instants for OOMs and iteration "
                      "marks. From a report: its sampled timeline and one dump of what is live."},
                     {"perfetto-json",
                      "The counters and instants as Chrome Trace Event JSON (chrome://tracing too): allocated and "
                      "reserved as two counters of their own (one counter's several values would be stacked); no "
                      "heap profile, and the JSON format has no units."},
                     {"timeline",
                      "JSON of allocated/reserved over time, OOMs and iteration marks (what scripts/gpushim-plot "
                      "draws)."},
                 },
             .required = true},
            {.name = "--output",
             .kind = ValueKind::kText,
             .value_name = "FILE",
             .help = "where to write (\"-\" for stdout)",
             .required = true,
             .short_name = "-o"},
            {.name = "--metric",
             .kind = ValueKind::kChoice,
             .help = "folded, speedscope: what weighs a site (default: peak for traces, live for reports)",
             .choices = {{"live"}, {"peak"}}},
            {.name = "--lines", .help = "folded, speedscope: one frame per source line, not per function"},
            {.name = "--max-events",
             .kind = ValueKind::kCount,
             .value_name = "N",
             .help = "memory-viz: keep the newest N events per device, 0 for all",
             .fallback = "200000",
             .max = 1e15},
            {.name = "--max-points",
             .kind = ValueKind::kCount,
             .value_name = "N",
             .help = "perfetto(-json), timeline: thin each device's track to about N points, keeping peaks "
                     "(default 200000 for perfetto, 5000 for timeline; 0: all)",
             .max = 1e15},
        },
    .run = run_export,
};

}  // namespace gpushim::analysis
