#include <gtest/gtest.h>

#include "config/config.h"

namespace gpushim {
namespace {

ConfigResult parse(std::vector<std::pair<std::string, std::string>> vars) { return parse_config(vars); }

TEST(PythonConfig, PythonStacksOnByDefaultAndBooleanForms) {
  EXPECT_TRUE(parse({}).config.python_stacks);
  for (const char* off : {"0", "off", "OFF", "false", "no", " 0 "}) {
    const ConfigResult r = parse({{"GPUSHIM_PYTHON_STACKS", off}});
    ASSERT_TRUE(r.ok()) << off;
    EXPECT_FALSE(r.config.python_stacks) << off;
  }
  for (const char* on : {"1", "on", "true", "Yes"}) EXPECT_TRUE(parse({{"GPUSHIM_PYTHON_STACKS", on}}).config.python_stacks);
  const ConfigResult bad = parse({{"GPUSHIM_PYTHON_STACKS", "maybe"}});
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_NE(bad.errors[0].message().find("GPUSHIM_PYTHON_STACKS='maybe'"), std::string::npos);
}

TEST(PythonConfig, IterationSiteIsOneFunctionName) {
  EXPECT_EQ(parse({}).config.iteration_site, "");
  EXPECT_EQ(parse({{"GPUSHIM_ITERATION_SITE", " Trainer.step "}}).config.iteration_site, "Trainer.step");
  EXPECT_EQ(parse({{"GPUSHIM_ITERATION_SITE", "_ZN7Trainer4stepEv"}}).config.iteration_site, "_ZN7Trainer4stepEv");
  for (const char* bad : {"", "  ", "two names", "tab\there", "new\nline"})
    EXPECT_FALSE(parse({{"GPUSHIM_ITERATION_SITE", bad}}).ok()) << "'" << bad << "'";
  EXPECT_FALSE(parse({{"GPUSHIM_ITERATION_SITE", std::string(600, 'x')}}).ok());
}

}  // namespace
}  // namespace gpushim
