"""CPU accounting: threads by OS name (an engine thread apart from the rest of its stub), process
trees, and the CPU other work used."""
import os
import subprocess
import sys
import threading
import time

import psutil
import pytest

from harness.accounting import (CLOCK_TICKS, OtherWork, Sampler, own_cpu_seconds, parse_task_stat,
                                split_thread_cpu, thread_cpu_seconds, tree_cpu_seconds, tree_rss)


def test_task_stat_with_spaces_and_parentheses_in_the_name():
    line = "4242 (llm engine (0)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1 2 3\n"
    assert parse_task_stat(line) == ("llm engine (0)", 300 / CLOCK_TICKS)


def burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_named_thread_cpu_is_told_apart_from_the_rest_of_the_process():
    burned, release = threading.Event(), threading.Event()

    def engine():
        # How a thread gets an OS name (comm) a benchmark can find: the kernel keeps 15 bytes.
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write("tf-engine-test")
        burn(0.3)
        burned.set()
        release.wait()  # alive while measured: a thread that ended has left /proc/<pid>/task

    before = thread_cpu_seconds(os.getpid()).get("tf-engine-test", 0.0)
    thread = threading.Thread(target=engine)
    thread.start()
    try:
        assert burned.wait(60)
        during = thread_cpu_seconds(os.getpid())
        engine_seconds, rest = split_thread_cpu(os.getpid(), ("tf-engine-test",))
    finally:
        release.set()
        thread.join()
    assert before == 0.0 and during["tf-engine-test"] >= 0.25  # clock ticks of 10 ms
    assert engine_seconds == pytest.approx(during["tf-engine-test"], abs=0.05) and rest > 0
    assert rest == pytest.approx(sum(during.values()) - during["tf-engine-test"], abs=0.5)


def test_process_tree_cpu_and_memory_include_children():
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.5\n"
                              "while time.process_time() < end: pass\ntime.sleep(30)"])
    try:
        # Until the child has burnt its 0.5 s (a busy machine may take longer than 1 s to give it that).
        deadline = time.monotonic() + 60
        while sum(psutil.Process(child.pid).cpu_times()[:2]) < 0.45 and time.monotonic() < deadline:
            time.sleep(0.1)
        own = sum(os.times()[:2])
        assert tree_cpu_seconds(os.getpid()) >= own + 0.3
        assert tree_rss(os.getpid()) > tree_rss(child.pid) > 0
    finally:
        child.kill()
        child.wait()


def test_a_killed_grandchild_still_counts_in_the_tree_once_its_parent_reaped_it():
    """As a stub that a chaos run kills counts in its tritonserver: its CPU must not turn into
    "other work" when it is gone."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time\\nend = time.process_time() + 0.5\\n"
        "while time.process_time() < end: pass\\ntime.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "sys.stdin.readline()\n"
        "child.wait()\n"
        "print('reaped', flush=True)\n"
        "time.sleep(60)\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        deadline = time.monotonic() + 60
        while sum(child.cpu_times()[:2]) < 0.45 and time.monotonic() < deadline:
            time.sleep(0.1)
        before = tree_cpu_seconds(parent.pid)
        child.kill()
        parent.stdin.write("\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "reaped"
        assert tree_cpu_seconds(parent.pid) >= before - 0.05
        assert own_cpu_seconds() >= before
    finally:
        parent.kill()
        parent.wait()


def test_other_work_is_zero_when_only_this_process_works():
    with OtherWork() as others:
        burn(0.3)
    # Other processes of the shared machine may run meanwhile: only a bound holds.
    assert 0.0 <= others.cores <= os.cpu_count()
    frozen = others.cores
    burn(0.05)
    assert others.cores == frozen


def test_sampler_keeps_timed_samples_until_stopped():
    values = iter(range(1000))
    sampler = Sampler(lambda: next(values), every=0.01)
    sampler.start()
    time.sleep(0.15)
    sampler.stop()
    taken = sampler.values()
    assert len(taken) >= 5 and taken == list(range(len(taken)))
    start, end = sampler.samples[1][0], sampler.samples[3][0]
    assert sampler.between(start, end) == [1, 2, 3]
