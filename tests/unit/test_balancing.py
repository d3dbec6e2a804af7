"""The shared load table and the balancing gate, with ranks in separate processes as Triton's
Python model instances are."""
import json
import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from tritonfront.core.balancing import BalancingGate, LoadTable, remove_stale_tables, table_path
from tritonfront.triton.devices import instance_rank
from tritonfront.core.rank_load import Load


def rank_process(path, rank, ranks, commands, replies):
    """A rank in its own process: publishes loads and answers gate questions on request."""
    table = LoadTable(path, rank, ranks)
    for command, value in iter(commands.get, None):
        if command == "publish":
            table.publish(Load(outstanding_tokens=value))
            replies.put("ok")
        elif command == "least_loaded":
            replies.put(table.least_loaded())
        elif command == "wait":
            start = time.monotonic()
            passed = BalancingGate(table, timeout_s=value).wait()
            replies.put((passed, time.monotonic() - start))
    table.close()


class Rank:
    def __init__(self, context, path, rank, ranks):
        self.commands, self.replies = context.Queue(), context.Queue()
        self.process = context.Process(target=rank_process, args=(path, rank, ranks, self.commands, self.replies))
        self.process.start()

    def ask(self, command, value=None):
        self.commands.put((command, value))
        return self.replies.get(timeout=30)

    def send(self, command, value=None):
        self.commands.put((command, value))

    def stop(self):
        self.commands.put(None)
        self.process.join(30)


@pytest.fixture
def two_ranks(tmp_path):
    context = multiprocessing.get_context("spawn")
    path = table_path("llm", os.getpid(), tmp_path)
    ranks = [Rank(context, path, r, 2) for r in range(2)]
    yield ranks
    for rank in ranks:
        rank.stop()


def test_only_the_least_loaded_rank_takes_work(two_ranks):
    zero, one = two_ranks
    zero.ask("publish", 100)
    one.ask("publish", 40)
    assert zero.ask("least_loaded") is False
    assert one.ask("least_loaded") is True
    zero.ask("publish", 40)  # ties: both take work
    assert zero.ask("least_loaded") is True and one.ask("least_loaded") is True


def test_gate_holds_until_the_other_rank_takes_more(two_ranks):
    zero, one = two_ranks
    zero.ask("publish", 500)
    one.ask("publish", 100)
    zero.send("wait", 10.0)
    time.sleep(0.3)
    assert zero.replies.empty()  # still held
    one.ask("publish", 600)
    passed, waited = zero.replies.get(timeout=10)
    assert passed and 0.2 <= waited < 5  # held past the 0.3 s sleep, less the command's trip to the rank


def test_gate_gives_up_after_its_timeout(two_ranks):
    zero, one = two_ranks
    zero.ask("publish", 500)
    one.ask("publish", 100)
    passed, waited = zero.ask("wait", 0.2)
    assert not passed and 0.2 <= waited < 2


def test_a_rank_that_stops_publishing_is_ignored(tmp_path):
    path = table_path("llm", os.getpid(), tmp_path)
    busy, idle = LoadTable(path, 0, 2, stale_s=0.2), LoadTable(path, 1, 2, stale_s=0.2)
    busy.publish(Load(outstanding_tokens=500))
    idle.publish(Load(outstanding_tokens=0))
    assert not busy.least_loaded()
    time.sleep(0.3)  # the idle rank's heartbeat goes stale (its process died, say)
    assert busy.least_loaded()
    idle.close()
    assert not busy.snapshot()[1].any()
    busy.close()


def test_a_rank_that_never_started_is_ignored(tmp_path):
    table = LoadTable(table_path("llm", os.getpid(), tmp_path), 0, 3)
    table.publish(Load(outstanding_tokens=1000))
    assert table.least_loaded()
    table.close()


def test_tables_of_dead_servers_are_removed(tmp_path):
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(finished.stdout)
    stale, live = table_path("llm", dead_pid, tmp_path), table_path("llm", os.getpid(), tmp_path)
    LoadTable(stale, 0, 1).close()
    LoadTable(live, 0, 1).close()
    remove_stale_tables(tmp_path)
    assert not stale.exists() and live.exists()


def test_table_names_keep_servers_and_models_apart(tmp_path):
    assert table_path("llm", 10, tmp_path) != table_path("llm", 11, tmp_path)
    assert table_path("llm", 10, tmp_path) != table_path("llm_none", 10, tmp_path)
    assert table_path("a/b", 10, tmp_path).parent == tmp_path


def args_for(name, groups):
    return {"model_instance_name": name, "model_config": json.dumps({"name": "llm", "instance_group": groups})}


def test_rank_counts_instances_across_groups():
    groups = [{"name": "llm_0", "count": 2, "kind": "KIND_CPU"},
              {"name": "llm_1", "count": 1, "kind": "KIND_GPU", "gpus": [0, 1]}]
    names = ["llm_0_0", "llm_0_1", "llm_1_0", "llm_1_1"]
    assert [instance_rank(args_for(n, groups)) for n in names] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    with pytest.raises(ValueError, match="not in the instance groups"):
        instance_rank(args_for("llm_0_2", groups))


def test_live_loads_are_the_rows_of_the_ranks_that_publish(tmp_path):
    path = tmp_path / "table"
    first, second, gone = LoadTable(path, 0, 3, stale_s=0.5), LoadTable(path, 1, 3, stale_s=0.5), LoadTable(path, 2, 3)
    first.publish(Load(outstanding_tokens=10, waiting_requests=1, active_sequences=2, kv_cache_blocks=3,
                       kv_cache_capacity_blocks=64))
    second.publish(Load(outstanding_tokens=5, active_sequences=1, kv_cache_blocks=1, kv_cache_capacity_blocks=64))
    gone.close()
    assert first.live_loads() == [
        Load(outstanding_tokens=10, waiting_requests=1, active_sequences=2, kv_cache_blocks=3,
             kv_cache_capacity_blocks=64),
        Load(outstanding_tokens=5, active_sequences=1, kv_cache_blocks=1, kv_cache_capacity_blocks=64)]
