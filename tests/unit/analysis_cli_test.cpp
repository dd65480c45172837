// gpushim-analyze's declarative command line (analysis/cli.h): one table per command makes the
// parser, its checks and the help, so each test states the table and what a user types.
#include <gtest/gtest.h>

#include <cstdint>

#include "cli.h"

namespace gpushim::analysis {
namespace {

int RunNothing(const Cli&) { return 0; }

const CommandSpec kCliSample{
    .name = "sample",
    .operands = "INPUT",
    .min_operands = 1,
    .max_operands = 1,
    .summary = "a command for the tests",
    .description = "",
    .options =
        {
            {.name = "--format",
             .kind = ValueKind::kChoice,
             .help = "what to write",
             .fallback = "text",
             .choices = {{"text"}, {"json"}, {"torch"}}},
            {.name = "--top", .kind = ValueKind::kCount, .value_name = "N", .fallback = "10", .min = 1, .max = 100},
            {.name = "--ratio", .kind = ValueKind::kNumber, .value_name = "X", .min = 0, .max = 1},
            {.name = "--capacity", .kind = ValueKind::kBytes, .value_name = "B"},
            {.name = "--policy", .kind = ValueKind::kText, .value_name = "P", .repeatable = true},
            {.name = "--output", .kind = ValueKind::kText, .value_name = "FILE", .short_name = "-o"},
            {.name = "--dry-run", .help = "do nothing"},
        },
    .run = RunNothing,
};

struct CliParse {
  bool ok;
  Cli cli;
  std::string error;
};

CliParse CliParseOf(std::vector<std::string> args, const CommandSpec& spec = kCliSample) {
  CliParse p;
  p.ok = parse_cli(spec, args, &p.cli, &p.error);
  return p;
}

TEST(AnalysisCli, NearestNameIsTheLaunchersRule) {
  const std::vector<std::string> names{"policy", "dry-run", "top", "stack-depth", "help"};
  EXPECT_EQ(nearest_name("polcy", names), "policy");
  EXPECT_EQ(nearest_name("dryrun", names), "dry-run");
  EXPECT_EQ(nearest_name("tpo", names), "top");  // a swap of neighbours is one edit
  EXPECT_EQ(nearest_name("stack-dept", names), "stack-depth");
  EXPECT_EQ(nearest_name("frobnicate", names), "");
  EXPECT_EQ(nearest_name("o", names), "");  // too short to guess from
}

TEST(AnalysisCli, MisspeltOptionSuggestsTheNearestName) {
  CliParse p = CliParseOf({"--formt", "json", "in"});
  EXPECT_FALSE(p.ok);
  EXPECT_EQ(p.error, "unknown option --formt: did you mean --format?");
  p = CliParseOf({"-dry-run", "in"});
  EXPECT_EQ(p.error, "unknown option -dry-run: did you mean --dry-run?");
  p = CliParseOf({"--frobnicate", "in"});
  EXPECT_EQ(p.error, "unknown option --frobnicate");
}

TEST(AnalysisCli, InvalidChoiceNamesTheAcceptedOnes) {
  CliParse p = CliParseOf({"--format=jsn", "in"});
  EXPECT_FALSE(p.ok);
  EXPECT_EQ(p.error, "--format takes text, json or torch, not 'jsn'");
  p = CliParseOf({"--format", "JSON", "in"});  // ignoring case, read back as the table spells it
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(p.cli.text("--format"), "json");
}

TEST(AnalysisCli, SingleValueOptionGivenTwiceIsRefused) {
  CliParse p = CliParseOf({"--top", "3", "--top=4", "in"});
  EXPECT_FALSE(p.ok);
  EXPECT_EQ(p.error, "--top is given twice (each option may be given once)");
  p = CliParseOf({"-o", "a", "--output", "b", "in"});  // spellings of one option count as one
  EXPECT_EQ(p.error, "--output is given twice (each option may be given once)");
  p = CliParseOf({"--dry-run", "--dry-run", "in"});
  EXPECT_EQ(p.error, "--dry-run is given twice (each option may be given once)");
  p = CliParseOf({"--policy", "a", "--policy=b", "in"});  // declared repeatable
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(p.cli.all("--policy"), (std::vector<std::string>{"a", "b"}));
}

TEST(AnalysisCli, ValuesAreCheckedAgainstTheirKind) {
  EXPECT_EQ(CliParseOf({"--top", "0", "in"}).error, "--top takes a whole number from 1 to 100, not '0'");
  EXPECT_EQ(CliParseOf({"--top", "-3", "in"}).error, "--top takes a whole number from 1 to 100, not '-3'");
  EXPECT_EQ(CliParseOf({"--top", "12x", "in"}).error, "--top takes a whole number from 1 to 100, not '12x'");
  EXPECT_EQ(CliParseOf({"--ratio", "nan", "in"}).error, "--ratio takes a number from 0 to 1, not 'nan'");
  EXPECT_EQ(CliParseOf({"--ratio", "1.5", "in"}).error, "--ratio takes a number from 0 to 1, not '1.5'");
  EXPECT_EQ(CliParseOf({"--capacity", "8Q", "in"}).error,
            "--capacity takes bytes above 0 with units (8GiB, 512MiB, 80GB, plain bytes), not '8Q'");
  // 0 read as "not given": the recorded capacity was replayed without a word.
  EXPECT_EQ(CliParseOf({"--capacity", "0", "in"}).error,
            "--capacity takes bytes above 0 with units (8GiB, 512MiB, 80GB, plain bytes), not '0'");
  EXPECT_EQ(CliParseOf({"--dry-run=yes", "in"}).error, "--dry-run takes no value");
  EXPECT_EQ(CliParseOf({"in", "--top"}).error, "--top needs a value (--top N)");
  EXPECT_EQ(CliParseOf({"-o", "--dry-run", "in"}).error, "-o needs a value (-o FILE)");
  CliParse p = CliParseOf({"--top", "7", "--ratio=0.25", "--capacity", "1.5GiB", "in"});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(p.cli.count("--top"), 7u);
  EXPECT_EQ(p.cli.number("--ratio"), 0.25);
  EXPECT_EQ(p.cli.bytes("--capacity"), 1610612736u);
}

TEST(AnalysisCli, FallbacksShortNamesAndOperands) {
  CliParse p = CliParseOf({"-o", "-", "--", "--not-an-option"});
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(p.cli.text("--output"), "-");
  EXPECT_EQ(p.cli.operands, (std::vector<std::string>{"--not-an-option"}));
  EXPECT_FALSE(p.cli.has("--top"));
  EXPECT_EQ(p.cli.count("--top"), 10u);  // the table's fallback
  EXPECT_EQ(p.cli.text("--format"), "text");
  EXPECT_THROW(p.cli.text("--undeclared"), std::logic_error);
  EXPECT_EQ(CliParseOf({}).error, "expects INPUT (0 inputs given)");
  EXPECT_EQ(CliParseOf({"a", "b"}).error, "expects INPUT (2 inputs given)");
  // --help wins over everything else on the line, so that a broken line can still ask.
  p = CliParseOf({"--bogus", "--help"});
  ASSERT_TRUE(p.ok);
  EXPECT_TRUE(p.cli.has("--help"));
}

TEST(AnalysisCli, RequiredOptionsAreNamedWhenMissing) {
  const CommandSpec spec{.name = "req",
                         .operands = "",
                         .options = {{.name = "--check", .required = true},
                                     {.name = "--output", .kind = ValueKind::kText, .value_name = "FILE",
                                      .required = true, .short_name = "-o"}},
                         .run = RunNothing};
  EXPECT_EQ(CliParseOf({"-o", "x"}, spec).error, "--check is required");
  EXPECT_EQ(CliParseOf({"--check"}, spec).error, "-o FILE is required");
  EXPECT_TRUE(CliParseOf({"--check", "-o", "x"}, spec).ok);
}

TEST(AnalysisCli, HelpComesFromTheTable) {
  const std::string help = help_text(kCliSample);
  EXPECT_EQ(help.rfind("usage: gpushim-analyze sample INPUT [--format text|json|torch] [--top N]", 0), 0u) << help;
  EXPECT_NE(help.find("  --format text|json|torch\n"), std::string::npos) << help;  // too wide: help below
  EXPECT_NE(help.find(" what to write (default text)\n"), std::string::npos) << help;
  EXPECT_NE(help.find("  -o, --output FILE"), std::string::npos) << help;
  EXPECT_NE(help.find("[--policy P]..."), std::string::npos) << help;
  EXPECT_NE(help.find("  -h, --help"), std::string::npos) << help;
  for (const std::string& line : {help, commands_text({&kCliSample})}) EXPECT_EQ(line.back(), '\n');
}

// Every real command: each fallback passes its own option's check, each option is in the help,
// and --help parses.
TEST(AnalysisCli, EveryCommandsTableIsConsistent) {
  for (const CommandSpec* spec : {&kSummaryCommand, &kReplayCommand, &kDiffCommand, &kMergeCommand, &kExportCommand,
                                  &kConfigCommand}) {
    const std::string help = help_text(*spec);
    EXPECT_EQ(help.rfind(std::string("usage: gpushim-analyze ") + spec->name, 0), 0u);
    for (const OptionSpec& o : spec->options) {
      EXPECT_NE(help.find(o.name), std::string::npos) << spec->name << " " << o.name;
      for (const Choice& c : o.choices) EXPECT_NE(help.find(c.name), std::string::npos) << o.name << " " << c.name;
      if (!o.fallback) continue;
      std::vector<std::string> args{std::string(o.name) + "=" + o.fallback};
      for (const OptionSpec& r : spec->options)
        if (r.required && &r != &o)
          args.push_back(r.kind == ValueKind::kFlag ? std::string(r.name)
                                                    : std::string(r.name) + "=" + (r.choices.empty() ? "x" : r.choices[0].name));
      for (size_t i = 0; i < spec->min_operands; ++i) args.push_back("in");
      CliParse p = CliParseOf(args, *spec);
      EXPECT_TRUE(p.ok) << spec->name << " " << o.name << ": " << p.error;
    }
    EXPECT_TRUE(CliParseOf({"--help"}, *spec).cli.has("--help"));
  }
}

}  // namespace
}  // namespace gpushim::analysis
