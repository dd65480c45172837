"""fork and exec: fork at any moment never deadlocks a child; children that never use CUDA exit
cleanly and write nothing; a process that uses CUDA on its own (after exec, or forked before its
parent touched CUDA) gets its own report."""
import glob
import json
import os
import tempfile

from shimtest import POLICIES, SANITIZER, ShimTestCase, check_sanitizer_clean, program, run, scaled, last_json

MiB = 1 << 20



def reports_in(d):
    out = {}
    for path in sorted(glob.glob(os.path.join(d, "*.json"))):
        with open(path) as f:
            rep = json.load(f)
        out[rep["pid"]] = rep
    return out


class ForkAtAnyMoment(ShimTestCase):
    def test_fork_while_another_thread_makes_the_first_cuda_call(self):
        # Without the shim no round hangs (CUDA is up before the race); with the handlers
        # registered at the first call, about 3 rounds in 100 did: 200 rounds would all pass with
        # that bug once in 400 runs. Sanitizer runs (scaled down) may see hangs of their own
        # allocators anyway (below), so they run fewer rounds.
        rounds = scaled(200, 30)
        env = {"GPUSHIM_REPORT": "off", "GPUSHIM_SUMMARY": "0"}
        if SANITIZER == "thread":
            # TSan cannot follow a fork of a multi-threaded process: by default it kills a child
            # that starts a thread (this child builds its own shim, whose gpushim-live thread
            # starts), and at the child's exit it reports the parent's threads, which do not
            # exist there, as leaked. TSan's own options turn both off; races are still checked.
            env["TSAN_OPTIONS"] = os.environ.get("TSAN_OPTIONS", "") + ":die_after_fork=0:report_thread_leaks=0"
        for preload in (False, True):
            with self.subTest(preload=preload):
                r = run([program("e2e_fork_during_init"), str(rounds)], preload=preload, env=env,
                        expect_report=False, timeout=600)
                if preload and SANITIZER:
                    # clang-14's sanitizer allocators have no fork handlers (ASan's came in LLVM
                    # 18, llvm/llvm-project#75290; the hang is llvm/llvm-project#63224), and its
                    # TSan does not lock its allocator around fork either: a child forked while
                    # another thread is inside the sanitizer's malloc waits forever at its first
                    # allocation, and here the child builds its own shim, which allocates. The hung
                    # children's stacks (gdb) are all in the sanitizer's allocator: ASan's allocator
                    # lock, or TSan's SizeClassAllocator64::GetFromAllocator (2 rounds in 200 under
                    # TSan, from the shim's first operator new in the child). glibc's malloc is
                    # fork-safe, so the normal run asserts no hang at all; this one still asserts
                    # that every round ran, that none failed, and no sanitizer report.
                    result = last_json(r)
                    self.assertEqual((result["rounds"], result["failed"]), (rounds, 0), r.stderr)
                    check_sanitizer_clean(r.stderr)
                    continue
                self.assertRanOK(r)
                self.assertEqual(last_json(r), {"rounds": rounds, "hung": 0, "failed": 0})

    def test_fork_while_another_thread_loads_the_core(self):
        # The preload's core is dlopened at the first hooked call (interpose/front/): a fork in the
        # middle of that load gave the child a half-loaded core and the loader's state in mid-change
        # (16 crashed children in 300 rounds), and one taken while the shim walked the loaded objects
        # (dl_iterate_phdr) gave it the loader's write lock held, so that its own dlopen hung (2 in
        # 300). The front's fork handler waits for the shim's loader work.
        rounds = scaled(100, 30)
        env = {"GPUSHIM_REPORT": "off", "GPUSHIM_SUMMARY": "0"}
        if SANITIZER == "thread":
            env["TSAN_OPTIONS"] = os.environ.get("TSAN_OPTIONS", "") + ":die_after_fork=0:report_thread_leaks=0"
        for preload in (False, True):
            with self.subTest(preload=preload):
                # Under the sanitizers, hung children are expected (below) and not counted: each waited
                # out the full 20 s (the ASan stage spent a minute here), where 5 s tell them apart.
                hang_s = 5 if preload and SANITIZER else 20
                r = run([program("e2e_fork_during_load"), str(rounds), str(hang_s)], preload=preload, env=env,
                        expect_report=False, timeout=600)
                self.assertEqual(r.returncode, 0, r.stderr)
                result = last_json(r)
                if preload and SANITIZER:
                    # The sanitizers' allocators hang fork children of their own (above): every
                    # round ran, none crashed or failed, and no sanitizer report.
                    self.assertEqual((result["rounds"], result["crashed"], result["other"], result["setup_failed"],
                                      result["core_already_loaded"]), (rounds, 0, 0, 0, 0), result)
                    check_sanitizer_clean(r.stderr)
                    continue
                self.assertEqual(result, {"rounds": rounds, "ok": rounds, "hung": 0, "setup_failed": 0,
                                          "core_already_loaded": 0, "crashed": 0, "other": 0})

    def test_many_threads_allocating_while_main_forks(self):
        # What CUDA itself answers in such a child, without the shim.
        base = run([program("e2e_fork_stress"), "2", "4"], preload=False, expect_report=False)
        self.assertRanOK(base)
        base_answers = last_json(base)["child_answers"]
        self.assertEqual(len(base_answers), 1, base_answers)
        for policy in POLICIES:
            with self.subTest(policy=policy):
                forks = scaled(150, 10)
                r = run([program("e2e_fork_stress"), "8", str(forks)],
                        env={"GPUSHIM_POLICY": policy, "GPUSHIM_SUMMARY": "0", "GPUSHIM_STACK_DEPTH": "8"},
                        timeout=600)
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["forks"], forks)
                self.assertEqual(out["hung"], 0)
                self.assertEqual(out["bad_exit"], 0)
                self.assertEqual(out["errors"], 0)
                self.assertGreater(out["allocs"], 0)
                # The child gets CUDA's own answer (the parent's pool is not its memory), and the
                # shim is not active there.
                self.assertEqual(out["child_answers"], base_answers)
                self.assertTrue(base_answers[0].startswith("-1 "), base_answers)
                # Nothing from any child: no line on stderr, no file; the parent's report is exact.
                self.assertEqual(r.shim_lines(), [])
                self.assertEqual(os.listdir(r.workdir), ["report.json"])
                self.assertEqual(r.report["pid"] > 0, True)
                dev = r.device(0)
                self.assertEqual(dev["total_allocs"], out["allocs"])
                self.assertEqual(dev["total_frees"], out["frees"])
                self.assertEqual(dev["live_count"], 0)


class DataLoaderPattern(ShimTestCase):
    def test_workers_that_never_touch_the_device_write_nothing(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                r = run([program("e2e_dataloader"), "parent-first", "6"],
                        env={"GPUSHIM_POLICY": policy, "GPUSHIM_SUMMARY": "0"})
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["bad_children"], 0)
                self.assertEqual(len(out["sent"]), 6)
                self.assertEqual(out["sent"][1], 2 * sum(range(100000)))
                self.assertEqual(os.listdir(r.workdir), ["report.json"])
                self.assertEqual(r.report["pid"], out["pid"])
                self.assertEqual(r.shim_lines(), [])
                dev = r.device(0)
                self.assertEqual(dev["live_count"], 1)
                self.assertEqual(dev["pool"]["requested_bytes"], MiB)
                self.assertEqual(dev["total_allocs"], 3)

    def test_workers_summary_lines_come_from_the_parent_only(self):
        r = run([program("e2e_dataloader"), "parent-first", "4"])
        self.assertRanOK(r)
        # One summary (the parent's), however many workers ran exit().
        self.assertEqual(sum(1 for l in r.shim_lines() if l.startswith("gpushim: device 0:")), 1, r.stderr)


class FreshProcesses(ShimTestCase):
    def test_children_forked_before_cuda_get_their_own_reports(self):
        for policy in POLICIES:
            with self.subTest(policy=policy):
                d = tempfile.mkdtemp(prefix="gpushim-e2e-")
                r = run([program("e2e_dataloader"), "fork-first", "3"],
                        env={"GPUSHIM_POLICY": policy, "GPUSHIM_REPORT": os.path.join(d, "r.%p.json"),
                             "GPUSHIM_SUMMARY": "0"}, expect_report=False)
                self.assertRanOK(r)
                out = last_json(r)
                self.assertEqual(out["bad_children"], 0)
                reports = reports_in(d)
                self.assertEqual(sorted(reports), sorted([out["pid"]] + out["children"]))
                self.assertEqual(reports[out["pid"]]["devices"][0]["pool"]["requested_bytes"], MiB)
                for i, pid in enumerate(out["children"]):
                    rep = reports[pid]
                    dev = rep["devices"][0]
                    self.assertEqual(dev["live_count"], 1)
                    self.assertEqual(dev["total_allocs"], 1)
                    self.assertEqual(dev["pool"]["requested_bytes"], (1 + i) * MiB)
                    self.assertTrue(any("worker_main" in f["function"] for s in rep["sites"] for f in s["frames"]))

    def test_exec_after_fork_gets_its_own_report(self):
        d = tempfile.mkdtemp(prefix="gpushim-e2e-")
        r = run([program("e2e_dataloader"), "exec", "1", program("e2e_leak_two_sites")],
                env={"GPUSHIM_REPORT": os.path.join(d, "r.%p.json"), "GPUSHIM_SUMMARY": "0"}, expect_report=False)
        self.assertRanOK(r)
        out = last_json(r)
        self.assertEqual(out["bad_children"], 0)
        reports = reports_in(d)
        self.assertEqual(sorted(reports), sorted([out["pid"]] + out["children"]))
        child = reports[out["children"][0]]
        self.assertTrue(child["exe"].endswith("e2e_leak_two_sites"))
        self.assertEqual(child["devices"][0]["live_count"], 5)
        self.assertEqual(reports[out["pid"]]["devices"][0]["live_count"], 1)


if __name__ == "__main__":
    import unittest
    unittest.main()
