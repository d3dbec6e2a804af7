"""tritonfront.watchdog's decisions, with the server's stubs and repository API replaced by
a fake: which disappearances are deaths, which models get reloaded, and that the stubs a reload
leaves behind neither hide a later death nor count as one."""
import pytest

from tritonfront import watchdog as stub_watchdog


INSTANCES = {"tokenizer": ["tokenizer_0_0"], "encoder": ["encoder_0_0", "encoder_0_1"]}


class FakeServer:
    def __init__(self, states: dict[str, str]):
        self.stubs = {}
        self.states, self.reloads, self.next_pid = dict(states), [], 0
        self.during_reload = None  # called inside a reload, e.g. to kill another stub meanwhile
        for model in INSTANCES:
            self.start(model)

    def start(self, model: str) -> None:
        for instance in INSTANCES[model]:
            self.next_pid += 1
            self.stubs[self.next_pid] = (model, instance)

    def reload(self, model: str, how: str) -> None:
        """A reload starts new stubs for the model's instances; the old live ones stay (Triton
        never unloads a version that lost a stub)."""
        self.reloads.append(model)
        self.start(model)
        if self.during_reload:
            self.during_reload()


@pytest.fixture
def server(monkeypatch):
    fake = FakeServer({"tokenizer": "READY", "encoder": "READY", "embed": "READY"})
    assert fake.stubs == {1: ("tokenizer", "tokenizer_0_0"), 2: ("encoder", "encoder_0_0"), 3: ("encoder", "encoder_0_1")}
    monkeypatch.setattr(stub_watchdog, "live_stubs", lambda pid: dict(fake.stubs))
    monkeypatch.setattr(stub_watchdog.psutil, "pid_exists", lambda pid: pid in fake.stubs)
    monkeypatch.setattr(stub_watchdog.Repository, "states", lambda self: dict(fake.states))
    monkeypatch.setattr(stub_watchdog.Repository, "reload", lambda self, model, how: fake.reload(model, how))
    return fake


def watchdog(**kwargs) -> stub_watchdog.StubWatchdog:
    dog = stub_watchdog.StubWatchdog(server_pid=1, url="127.0.0.1:1", log=lambda line: None, **kwargs)
    dog._known = stub_watchdog.live_stubs(1)
    return dog


def test_a_dead_stub_reloads_its_model_once(server):
    dog = watchdog()
    del server.stubs[2]
    restores = dog.check()
    assert [(r.model, r.instances, r.error) for r in restores] == [("encoder", ["encoder_0_0"], None)]
    assert server.reloads == ["encoder"]
    assert dog.check() == [] and server.reloads == ["encoder"]


def test_nothing_happens_while_every_stub_runs(server):
    dog = watchdog()
    assert dog.check() == [] and dog.check() == []
    assert server.reloads == []


def test_a_stub_replaced_by_a_reload_of_someone_else_is_no_death(server):
    dog = watchdog()
    server.stubs[50] = ("tokenizer", "tokenizer_0_0")  # the new instance starts before the old one stops
    dog.check()
    del server.stubs[1]
    assert dog.check() == [] and server.reloads == []


def test_an_unloaded_model_is_left_alone(server):
    dog = watchdog()
    del server.stubs[1]
    server.states["tokenizer"] = "UNAVAILABLE"
    assert dog.check() == [] and server.reloads == []


def test_a_death_during_another_reload_is_found_next(server):
    dog = watchdog()
    server.during_reload = lambda: server.stubs.pop(1, None)
    del server.stubs[2]
    assert [r.model for r in dog.check()] == ["encoder"]
    server.during_reload = None
    assert [r.model for r in dog.check()] == ["tokenizer"]


def test_a_leftover_stub_does_not_hide_the_death_of_its_successor(server):
    dog = watchdog()
    del server.stubs[2]
    dog.check()  # encoder reloaded: old encoder_0_1 (pid 3) stays, new 4 and 5 start
    dog.check()
    new_encoder_0_1 = max(pid for pid, key in server.stubs.items() if key == ("encoder", "encoder_0_1"))
    del server.stubs[new_encoder_0_1]
    assert [(r.model, r.instances) for r in dog.check()] == [("encoder", ["encoder_0_1"])]


def test_a_leftover_stub_killed_once_idle_is_no_death(server, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(stub_watchdog.time, "monotonic", lambda: clock[0])
    killed = []

    class Process:
        def __init__(self, pid):
            if pid not in server.stubs:
                raise stub_watchdog.psutil.NoSuchProcess(pid)
            self.pid = pid

        def cpu_times(self):
            # 0.5 cores until t=33 (finishing its last requests), then 0.01 (an idle engine loop)
            busy = min(clock[0], 33.0) * 0.5 + max(clock[0] - 33.0, 0.0) * 0.01
            return type("Times", (), {"user": busy, "system": 0.0})()

        def status(self):
            return "sleeping"

        def kill(self):
            killed.append(self.pid)
            del server.stubs[self.pid]

    monkeypatch.setattr(stub_watchdog.psutil, "Process", Process)
    dog = watchdog(reap_after_s=30.0, idle_s=5.0)
    del server.stubs[2]
    dog.check()
    for clock[0] in (10.0, 31.0, 33.0, 36.0, 38.0):
        dog.check()
    assert killed == []  # busy over 31..36, then idle for 2 s only
    clock[0] = 41.5
    dog.check()
    assert killed == [3]
    clock[0] = 42.0
    assert dog.check() == [] and server.reloads == ["encoder"]
