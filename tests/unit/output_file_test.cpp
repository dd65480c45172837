#include "report/output_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "report/report_writer.h"
#include "util/log.h"

namespace gpushim {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Names in /dev that start with "null.": what a suffixed report next to /dev/null would add.
int NullSiblings() {
  int n = 0;
  if (DIR* d = opendir("/dev")) {
    while (const dirent* e = readdir(d)) n += std::string(e->d_name).rfind("null.", 0) == 0;
    closedir(d);
  }
  return n;
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

// Restores an environment variable however the test ends.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

class OutputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpushim_output_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    const std::string cmd = "rm -rf '" + dir_ + "'";
    ASSERT_EQ(system(cmd.c_str()), 0);
  }
  std::string dir_;
};

TEST(ExpandPathTemplate, DefaultName) {
  EXPECT_EQ(expand_path_template("", "prog", 12), "gpushim.prog.12.json");
  EXPECT_EQ(expand_path_template("", "/usr/bin/prog", 12), "gpushim.prog.12.json") << "basename only";
  EXPECT_EQ(expand_path_template("", "prog", 12, ".prom"), "gpushim.prog.12.prom");
  EXPECT_EQ(expand_path_template("", "", 7), "gpushim.unknown.7.json");
  EXPECT_EQ(expand_path_template("out/", "prog", 12), "out/gpushim.prog.12.json") << "directory template";
}

TEST(ExpandPathTemplate, Directives) {
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  {
    ScopedEnv rank("RANK", "5");
    EXPECT_EQ(expand_path_template("r%p-%h-%r.json", "prog", 99), std::string("r99-") + host + "-5.json");
  }
  {
    ScopedEnv rank("RANK", nullptr);
    EXPECT_EQ(expand_path_template("x.%r", "prog", 1), "x.norank");
  }
  EXPECT_EQ(expand_path_template("100%%-%p", "prog", 3), "100%-3");
  EXPECT_EQ(expand_path_template("a%xb%", "prog", 3), "a%xb%") << "unknown and trailing % stay literal";
  EXPECT_EQ(expand_path_template("%%p", "prog", 3), "%p");
  EXPECT_EQ(expand_path_template("%p%p", "prog", 3), "33");
}

TEST_F(OutputFileTest, WritesWithMode0600) {
  const std::string path = dir_ + "/gpushim.prog.12.json";
  const mode_t old_mask = umask(0);  // mode must not depend on a permissive umask
  const std::string got = write_new_file(path, "{\"a\":1}\n");
  umask(old_mask);
  ASSERT_EQ(got, path);
  EXPECT_EQ(ReadFile(path), "{\"a\":1}\n");
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(OutputFileTest, NeverOverwrites) {
  const std::string path = dir_ + "/gpushim.prog.12.json";
  EXPECT_EQ(write_new_file(path, "first"), path);
  EXPECT_EQ(write_new_file(path, "second"), dir_ + "/gpushim.prog.12.1.json");
  EXPECT_EQ(write_new_file(path, "third"), dir_ + "/gpushim.prog.12.2.json");
  EXPECT_EQ(ReadFile(path), "first");
  EXPECT_EQ(ReadFile(dir_ + "/gpushim.prog.12.1.json"), "second");
  EXPECT_EQ(ReadFile(dir_ + "/gpushim.prog.12.2.json"), "third");
  // No extension: the suffix goes at the end; a leading dot is not an extension.
  EXPECT_EQ(write_new_file(dir_ + "/report", "a"), dir_ + "/report");
  EXPECT_EQ(write_new_file(dir_ + "/report", "b"), dir_ + "/report.1");
  EXPECT_EQ(write_new_file(dir_ + "/.hidden", "a"), dir_ + "/.hidden");
  EXPECT_EQ(write_new_file(dir_ + "/.hidden", "b"), dir_ + "/.hidden.1");
}

TEST_F(OutputFileTest, SymlinkIsNotFollowed) {
  const std::string target = dir_ + "/victim";
  { std::ofstream(target) << "precious"; }
  const std::string path = dir_ + "/gpushim.prog.12.json";
  ASSERT_EQ(symlink(target.c_str(), path.c_str()), 0);
  const std::string dangling = dir_ + "/dangling.json";
  ASSERT_EQ(symlink((dir_ + "/would_be_created").c_str(), dangling.c_str()), 0);

  EXPECT_EQ(write_new_file(path, "report"), dir_ + "/gpushim.prog.12.1.json");
  EXPECT_EQ(ReadFile(target), "precious");
  EXPECT_EQ(ReadFile(dir_ + "/gpushim.prog.12.1.json"), "report");

  EXPECT_EQ(write_new_file(dangling, "report"), dir_ + "/dangling.1.json");
  EXPECT_FALSE(Exists(dir_ + "/would_be_created")) << "a dangling symlink must not be followed either";
}

TEST_F(OutputFileTest, CharacterDeviceIsWrittenNotSuffixed) {
  // GPUSHIM_REPORT=/dev/null means "discard", not "create /dev/null.1 next to it".
  struct stat before;
  ASSERT_EQ(lstat("/dev/null", &before), 0);
  ASSERT_TRUE(S_ISCHR(before.st_mode));
  const int siblings = NullSiblings();
  EXPECT_EQ(write_new_file("/dev/null", "report"), "/dev/null");
  std::string written;
  const int fd = create_new_file("/dev/null", &written);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(written, "/dev/null");
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(st.st_rdev, before.st_rdev);
  close(fd);
  EXPECT_EQ(NullSiblings(), siblings);

  // A symlink to a device is still never followed: the safe path adds a suffix.
  const std::string link = dir_ + "/to_null.json";
  ASSERT_EQ(symlink("/dev/null", link.c_str()), 0);
  EXPECT_EQ(write_new_file(link, "report"), dir_ + "/to_null.1.json");
  EXPECT_EQ(ReadFile(dir_ + "/to_null.1.json"), "report");
}

TEST_F(OutputFileTest, ExistingDirectoryAtPathGetsSuffix) {
  ASSERT_EQ(mkdir((dir_ + "/r.json").c_str(), 0700), 0);
  EXPECT_EQ(write_new_file(dir_ + "/r.json", "x"), dir_ + "/r.1.json");
}

TEST_F(OutputFileTest, UnwritableDirectoryFallsBackToTmpdir) {
  // A missing directory stands in for an unwritable one: the tests may run as root, which
  // ignores permission bits.
  ScopedEnv tmpdir("TMPDIR", (dir_ + "/").c_str());
  const std::string wanted = dir_ + "/no/such/dir/gpushim.prog.12.json";
  const std::string got = write_new_file(wanted, "data");
  EXPECT_EQ(got, dir_ + "/gpushim.prog.12.json");
  EXPECT_EQ(ReadFile(got), "data");
  // The fallback also never overwrites.
  EXPECT_EQ(write_new_file(wanted, "again"), dir_ + "/gpushim.prog.12.1.json");

  if (geteuid() != 0) {
    const std::string ro = dir_ + "/ro";
    ASSERT_EQ(mkdir(ro.c_str(), 0500), 0);
    EXPECT_EQ(write_new_file(ro + "/x.json", "data"), dir_ + "/x.json");
  }
}

TEST_F(OutputFileTest, ANamedPathNeverFallsBack) {
  // Where the user named is where they look: a path that cannot be created leaves no file anywhere.
  set_log_enabled(false);
  ScopedEnv tmpdir("TMPDIR", (dir_ + "/").c_str());
  const std::string wanted = dir_ + "/no/such/dir/r.json";
  EXPECT_EQ(write_new_file(wanted, "data", WhereAllowed::kNamedPathOnly), "");
  std::string created;
  EXPECT_EQ(create_new_file(dir_ + "/no/such/dir/t.trace", &created, WhereAllowed::kNamedPathOnly), -1);
  set_log_enabled(true);
  DIR* d = opendir(dir_.c_str());
  ASSERT_NE(d, nullptr);
  int entries = 0;
  while (dirent* e = readdir(d)) entries += std::string(e->d_name) != "." && std::string(e->d_name) != "..";
  closedir(d);
  EXPECT_EQ(entries, 0);
  EXPECT_EQ(where_allowed(""), WhereAllowed::kOrTmpdir);
  EXPECT_EQ(where_allowed("r.json"), WhereAllowed::kNamedPathOnly);
}

TEST_F(OutputFileTest, FallbackFailureReturnsEmpty) {
  set_log_enabled(false);
  ScopedEnv tmpdir("TMPDIR", (dir_ + "/also/missing").c_str());
  EXPECT_EQ(write_new_file(dir_ + "/missing/x.json", "data"), "");
  EXPECT_EQ(write_new_file("", "data"), "");
  set_log_enabled(true);
}

// The command a missing directory's line suggests is safe to paste: one shell word, and a name
// that starts with '-' (a relative path: the working directory was unknown) is no option to mkdir.
TEST_F(OutputFileTest, MissingDirectorySuggestsACommandSafeToPaste) {
  char old[PATH_MAX];
  ASSERT_NE(getcwd(old, sizeof old), nullptr);
  ASSERT_EQ(chdir(dir_.c_str()), 0);
  const std::string dash = cannot_create_reason("-out/r.json", ENOENT);
  const std::string both = cannot_create_reason("-my out/r.json", ENOENT);
  const std::string plain = cannot_create_reason("out's/r.json", ENOENT);
  ASSERT_EQ(chdir(old), 0);
  EXPECT_EQ(dash, "its directory -out does not exist (gpushim creates no directories: mkdir -p -- -out)");
  EXPECT_EQ(both, "its directory -my out does not exist (gpushim creates no directories: mkdir -p -- '-my out')");
  EXPECT_EQ(plain, "its directory out's does not exist (gpushim creates no directories: mkdir -p 'out'\\''s')");
}

TEST_F(OutputFileTest, LargeAndEmptyPayloads) {
  std::string big(8 << 20, 'x');
  for (size_t i = 0; i < big.size(); i += 4097) big[i] = static_cast<char>('a' + i % 26);
  const std::string path = dir_ + "/big.json";
  ASSERT_EQ(write_new_file(path, big), path);
  EXPECT_EQ(ReadFile(path), big);
  ASSERT_EQ(write_new_file(dir_ + "/empty.json", ""), dir_ + "/empty.json");
  EXPECT_EQ(ReadFile(dir_ + "/empty.json"), "");
}

TEST_F(OutputFileTest, FailedWriteRemovesPartialFile) {
  // ENOSPC cannot be provoked without mounting a small filesystem; a file size limit fails the
  // same write loop midway (EFBIG) and takes the same clean-up path.
  struct rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct rlimit small = old_limit;
  small.rlim_cur = 4096;
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  set_log_enabled(false);
  const std::string got = write_new_file(dir_ + "/partial.json", std::string(1 << 20, 'x'));
  set_log_enabled(true);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  signal(SIGXFSZ, old_handler);
  EXPECT_EQ(got, "");
  EXPECT_FALSE(Exists(dir_ + "/partial.json"));
  EXPECT_FALSE(Exists(dir_ + "/partial.1.json"));
}

TEST_F(OutputFileTest, FileSizeLimitNeverKillsTheHost) {
  // SIGXFSZ left at its default action (terminate): the write must fail, not end the process.
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_DFL);
    struct rlimit small = {4096, 4096};
    if (setrlimit(RLIMIT_FSIZE, &small) != 0) _exit(10);
    set_log_enabled(false);
    const std::string got = write_new_file(dir_ + "/limited.json", std::string(1 << 20, 'x'));
    // Still alive; and a write the host itself makes afterwards still gets the normal signal.
    sigset_t pending;
    sigpending(&pending);
    _exit(got.empty() && !Exists(dir_ + "/limited.json") && sigismember(&pending, SIGXFSZ) == 0 ? 0 : 11);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(OutputFileTest, AStderrPastTheFileSizeLimitNeverKillsTheHost) {
  // A host whose stderr is a log file already past its RLIMIT_FSIZE: the shim's one-line messages
  // and its exit summary are lost there, the host lives. Both wrote unguarded and ended it with
  // SIGXFSZ (found when a test binary's output went to a file instead of ctest's pipe).
  const std::string log = dir_ + "/host-stderr.log";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_DFL);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    const std::string earlier(8192, 'h');
    if (fd < 0 || write(fd, earlier.data(), earlier.size()) != static_cast<ssize_t>(earlier.size())) _exit(10);
    if (dup2(fd, STDERR_FILENO) != STDERR_FILENO) _exit(11);
    struct rlimit small = {4096, 4096};
    if (setrlimit(RLIMIT_FSIZE, &small) != 0) _exit(12);
    set_log_enabled(true);
    log_line("a message the host's stderr cannot take");
    const std::string got = write_new_file(dir_ + "/limited.json", std::string(1 << 20, 'x'));  // logs why
    ReportData report;
    report.exe = "host";
    write_summary(report, dir_ + "/limited.json", 5, stderr);
    sigset_t pending;
    sigpending(&pending);
    _exit(got.empty() && sigismember(&pending, SIGXFSZ) == 0 ? 0 : 13);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(ReadFile(log), std::string(8192, 'h'));  // nothing appended past the limit
}

TEST_F(OutputFileTest, KilledMidWriteLeavesNothingHalfWritten) {
  // kill -9 at staggered moments while a large report is being written: afterwards the name holds
  // either nothing or the whole file, never a truncated one.
  const std::string data(48 << 20, 'r');
  int complete = 0, absent = 0;
  for (int delay_us : {0, 200, 1000, 3000, 6000, 10000, 20000, 40000}) {
    const std::string path = dir_ + "/killed." + std::to_string(delay_us) + ".json";
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      set_log_enabled(false);
      write_new_file(path, data);
      _exit(0);
    }
    usleep(static_cast<useconds_t>(delay_us));
    kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) {
      ++absent;
      continue;
    }
    EXPECT_EQ(static_cast<size_t>(st.st_size), data.size()) << "a truncated file at " << path;
    ++complete;
  }
  EXPECT_EQ(complete + absent, 8);
}

TEST_F(OutputFileTest, AClosedPipeNeverKillsTheHost) {
  // `prog 2>&1 | head`, or a log collector that died: a line on stderr, a report to stdout, or the
  // summary into a pipe whose reader is gone raised SIGPIPE, whose default action ended the host
  // (status 141) before its own next line. The output is lost, the host lives, its status is its own.
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGPIPE, SIG_DFL);
    int fds[2];
    if (pipe(fds) != 0) _exit(10);
    close(fds[0]);  // no reader
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    log_line("a line nobody reads");
    if (write_new_file("/dev/stdout", "{}") != "") _exit(11);  // refused: written nowhere
    ReportData r;
    write_summary(r, "", 5, stderr);
    _exit(7);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

TEST_F(OutputFileTest, HostsOwnPendingSigxfszIsLeftAlone) {
  // A SIGXFSZ the host had pending (blocked) before the shim wrote is the host's; keep it pending.
  sigset_t only, saved;
  sigemptyset(&only);
  sigaddset(&only, SIGXFSZ);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &only, &saved), 0);
  ASSERT_EQ(pthread_kill(pthread_self(), SIGXFSZ), 0);
  ASSERT_NE(write_new_file(dir_ + "/fine.json", "{}"), "");
  sigset_t pending;
  sigpending(&pending);
  EXPECT_EQ(sigismember(&pending, SIGXFSZ), 1);
  const timespec now = {0, 0};
  EXPECT_EQ(sigtimedwait(&only, nullptr, &now), SIGXFSZ);
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
}

}  // namespace
}  // namespace gpushim
