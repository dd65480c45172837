#include "live/snapshot_file.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "live/replace_file.h"

namespace gpushim {
namespace {

std::string SnapshotTempDir() {
  char tmpl[] = "/tmp/gpushim-snapfile-XXXXXX";
  const char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "/tmp";
}

std::string SnapshotRead(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int Entries(const std::string& dir) {
  int n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") ++n;
    closedir(d);
  }
  return n;
}

TEST(SnapshotPath, InsertsBeforeTheExtension) {
  EXPECT_EQ(snapshot_path("run/r.json", 3), "run/r.snapshot.3.json");
  EXPECT_EQ(snapshot_path("gpushim.prog.12.json", 1), "gpushim.prog.12.snapshot.1.json");
  EXPECT_EQ(snapshot_path("report", 2), "report.snapshot.2");
  EXPECT_EQ(snapshot_path("dir.v2/report", 2), "dir.v2/report.snapshot.2");
  EXPECT_EQ(snapshot_path("/x/.hidden", 1), "/x/.hidden.snapshot.1");
}

TEST(PublishNewFile, AppearsCompleteAndLeavesNoTemporary) {
  const std::string dir = SnapshotTempDir();
  const std::string path = dir + "/r.snapshot.1.json";
  EXPECT_EQ(publish_new_file(path, "{\"a\":1}\n"), path);
  EXPECT_EQ(SnapshotRead(path), "{\"a\":1}\n");
  EXPECT_EQ(Entries(dir), 1);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // like every report
  EXPECT_EQ(st.st_nlink, 1u);           // the temporary link is gone
}

TEST(PublishNewFile, NeverOverwritesAndTakesTheNextSuffix) {
  const std::string dir = SnapshotTempDir();
  const std::string path = dir + "/r.snapshot.1.json";
  { std::ofstream(path) << "someone else's"; }
  { std::ofstream(dir + "/r.snapshot.1.1.json") << "also taken"; }
  EXPECT_EQ(publish_new_file(path, "new"), dir + "/r.snapshot.1.2.json");
  EXPECT_EQ(SnapshotRead(path), "someone else's");
  EXPECT_EQ(SnapshotRead(dir + "/r.snapshot.1.2.json"), "new");
  EXPECT_EQ(Entries(dir), 3);
}

TEST(PublishNewFile, AnotherProcesssTemporaryIsNeverTouched) {
  // Another process with this pid (in another container sharing the directory) writing its
  // snapshot under the name a pid alone gave: it was removed first.
  const std::string dir = SnapshotTempDir();
  const std::string path = dir + "/r.snapshot.1.json";
  const std::string theirs = dir + "/.r.snapshot.1.json.tmp." + std::to_string(getpid());
  { std::ofstream(theirs) << "another process's snapshot"; }
  EXPECT_EQ(publish_new_file(path, "fresh"), path);
  EXPECT_EQ(SnapshotRead(path), "fresh");
  EXPECT_EQ(SnapshotRead(theirs), "another process's snapshot");
  EXPECT_EQ(Entries(dir), 2);
}

}  // namespace
}  // namespace gpushim
