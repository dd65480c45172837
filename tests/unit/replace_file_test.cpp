#include "live/replace_file.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <atomic>
#include <cstdlib>
#include <regex>
#include <set>
#include <fstream>
#include <sstream>
#include <thread>

namespace gpushim {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/gpushim-replace-XXXXXX";
  const char* d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "/tmp";
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The names in `dir`, sorted.
std::set<std::string> Names(const std::string& dir) {
  std::set<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.insert(e->d_name);
    closedir(d);
  }
  return names;
}

TEST(ReplaceFile, WritesThenReplacesAndLeavesNoTemporary) {
  const std::string dir = TempDir();
  const std::string path = dir + "/m.prom";
  ASSERT_EQ(replace_file_atomically(path, "first\n"), 0);
  EXPECT_EQ(Read(path), "first\n");
  struct stat before, after;
  ASSERT_EQ(stat(path.c_str(), &before), 0);
  ASSERT_EQ(replace_file_atomically(path, "second\n"), 0);
  ASSERT_EQ(stat(path.c_str(), &after), 0);
  EXPECT_EQ(Read(path), "second\n");
  EXPECT_NE(before.st_ino, after.st_ino);  // a new file renamed over the old one, not rewritten in place
  EXPECT_EQ(Names(dir), std::set<std::string>{"m.prom"});
}

TEST(ReplaceFile, TemporaryNamesAreUniqueBeyondThePid) {
  // Containers sharing a directory may run processes with equal pids: a name made of the pid
  // alone was the same in both.
  const std::string path = "/d/m.prom";
  const std::string a = replacement_temp_path(path), b = replacement_temp_path(path);
  const std::regex shape("/d/\\.m\\.prom\\.tmp\\." + std::to_string(getpid()) + "\\.[0-9a-f]{16}");
  EXPECT_TRUE(std::regex_match(a, shape)) << a;
  EXPECT_TRUE(std::regex_match(b, shape)) << b;
  EXPECT_NE(a, b);
}

TEST(ReplaceFile, ReadableByOthers) {
  const std::string dir = TempDir();
  const mode_t old = umask(022);
  ASSERT_EQ(replace_file_atomically(dir + "/m.prom", "x"), 0);
  umask(old);
  struct stat st;
  ASSERT_EQ(stat((dir + "/m.prom").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);  // node_exporter usually runs as another user
}

TEST(ReplaceFile, ReadersNeverSeeAPartialFile) {
  const std::string dir = TempDir();
  const std::string path = dir + "/m.prom";
  // Two versions large enough that a non-atomic rewrite would be caught half-way.
  const std::string a = std::string(256 * 1024, 'a') + "\nEND\n";
  const std::string b = std::string(192 * 1024, 'b') + "\nEND\n";
  ASSERT_EQ(replace_file_atomically(path, a), 0);
  std::atomic<bool> done{false};
  std::atomic<int> bad{0}, reads{0}, saw_a{0}, saw_b{0};
  std::thread reader([&] {
    while (!done.load()) {
      const std::string got = Read(path);
      ++reads;
      if (got == a) ++saw_a;
      else if (got == b) ++saw_b;
      else ++bad;
    }
  });
  // At least 400 replacements, and on until the reader has raced them enough (a loaded machine
  // may starve either thread for a while).
  int writes = 0;
  for (; writes < 400 || (reads.load() < 50 && writes < 100000); ++writes)
    ASSERT_EQ(replace_file_atomically(path, writes % 2 ? a : b), 0);
  done = true;
  reader.join();
  EXPECT_EQ(bad.load(), 0) << "of " << reads.load() << " reads";
  EXPECT_GE(reads.load(), 50) << "after " << writes << " replacements";
  EXPECT_GT(saw_a.load() + saw_b.load(), 0);
}

TEST(ReplaceFile, ASymlinkAtThePathIsReplacedNotFollowed) {
  const std::string dir = TempDir();
  const std::string victim = dir + "/victim";
  { std::ofstream(victim) << "keep"; }
  ASSERT_EQ(symlink(victim.c_str(), (dir + "/m.prom").c_str()), 0);
  ASSERT_EQ(replace_file_atomically(dir + "/m.prom", "new"), 0);
  EXPECT_EQ(Read(victim), "keep");
  EXPECT_EQ(Read(dir + "/m.prom"), "new");
}

TEST(ReplaceFile, AnotherProcesssTemporaryIsNeverTouched) {
  // What another process with this pid (in another container) writes at the moment, under the
  // names a pid alone gave: it was removed before each update.
  const std::string dir = TempDir();
  const std::string path = dir + "/m.prom";
  const std::string theirs = dir + "/.m.prom.tmp." + std::to_string(getpid());
  { std::ofstream(theirs) << "another process's update, half written"; }
  ASSERT_EQ(replace_file_atomically(path, "ok"), 0);
  EXPECT_EQ(Read(path), "ok");
  EXPECT_EQ(Read(theirs), "another process's update, half written");
  // Nor a symlink there, nor what it points to.
  ASSERT_EQ(unlink(theirs.c_str()), 0);
  const std::string victim = dir + "/victim";
  { std::ofstream(victim) << "keep"; }
  ASSERT_EQ(symlink(victim.c_str(), theirs.c_str()), 0);
  ASSERT_EQ(replace_file_atomically(path, "again"), 0);
  EXPECT_EQ(Read(victim), "keep");
  EXPECT_EQ(Read(path), "again");
  EXPECT_EQ(Names(dir), (std::set<std::string>{".m.prom.tmp." + std::to_string(getpid()), "m.prom", "victim"}));
}

TEST(ReplaceFile, FailuresReturnTheErrnoAndLeaveNothingBehind) {
  const std::string dir = TempDir();
  EXPECT_EQ(replace_file_atomically(dir + "/missing/m.prom", "x"), ENOENT);
  ASSERT_EQ(mkdir((dir + "/adir").c_str(), 0755), 0);
  EXPECT_NE(replace_file_atomically(dir + "/adir", "x"), 0);  // a directory at the name
  EXPECT_EQ(Names(dir), std::set<std::string>{"adir"});
  EXPECT_EQ(replace_file_atomically(dir + "/", "x"), EISDIR);
  EXPECT_EQ(replace_file_atomically("", "x"), EISDIR);
}

TEST(ReplaceFile, FileSizeLimitNeverKillsTheHost) {
  // The metrics file's last update runs in the host's exiting thread, where SIGXFSZ is at the
  // host's disposition (default: terminate): a file-size limit must cost the update, not the host.
  const std::string dir = TempDir();
  const std::string path = dir + "/m.prom";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_DFL);
    struct rlimit small = {4096, 4096};
    if (setrlimit(RLIMIT_FSIZE, &small) != 0) _exit(10);
    const int err = replace_file_atomically(path, std::string(1 << 20, 'm'));
    sigset_t pending;
    sigpending(&pending);
    _exit(err == EFBIG && Names(dir).empty() && sigismember(&pending, SIGXFSZ) == 0
              ? 0
              : 11);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace gpushim
