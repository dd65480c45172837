// The README's variable table must match the config table exactly: every variable the shim
// accepts is documented with its default, and the README documents no variable that does not exist.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <vector>
#include <set>
#include <sstream>
#include <string>

#include "config/config.h"

namespace gpushim {
namespace {

std::string strip_backticks(std::string s) {
  std::string out;
  for (char c : s)
    if (c != '`') out += c;
  return out;
}

TEST(ReadmeConfigTable, MatchesTheConfigTable) {
  std::ifstream in(GPUSHIM_SOURCE_DIR "/README.md");
  ASSERT_TRUE(in) << "README.md not found";
  std::map<std::string, std::string> rows;  // variable -> whole row without backticks
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `GPUSHIM_", 0) != 0) continue;
    const size_t end = line.find('`', 3);
    rows[line.substr(3, end - 3)] = strip_backticks(line);
  }
  std::set<std::string> known;
  for (const ConfigVariableDoc& d : config_variable_docs()) {
    known.insert(d.name);
    auto it = rows.find(d.name);
    ASSERT_NE(it, rows.end()) << d.name << " is missing from the README's variable table";
    // The default sits in the third column.
    std::vector<std::string> cols;
    std::stringstream ss(it->second);
    std::string col;
    while (std::getline(ss, col, '|')) cols.push_back(col);
    ASSERT_GE(cols.size(), 4u) << it->second;
    std::string def = cols[3];
    while (!def.empty() && def.front() == ' ') def.erase(def.begin());
    while (!def.empty() && def.back() == ' ') def.pop_back();
    EXPECT_EQ(def, d.default_value) << "README default of " << d.name;
  }
  for (const auto& [name, row] : rows) EXPECT_TRUE(known.count(name)) << "README documents unknown " << name;
}

}  // namespace
}  // namespace gpushim
