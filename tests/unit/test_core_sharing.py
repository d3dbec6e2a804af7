"""Encoder instances split the cores by how many of them compute at once."""
import os
import time

import numpy as np
import pytest
import torch

from tritonfront.core.core_sharing import CoreShare
from tritonfront.core.shared_tables import open_rows, table_path


def shares(tmp_path, instances=2, cores=2):
    rows = open_rows(table_path("encoder", os.getpid(), tmp_path, kind="cores"), instances, 2)
    taken = [[] for _ in range(instances)]
    return [CoreShare(rows, i, cores, set_threads=taken[i].append) for i in range(instances)], taken


def test_a_lone_pass_takes_every_core_and_a_busy_server_one_each(tmp_path):
    (a, b), (threads_a, threads_b) = shares(tmp_path)
    with a.computing():
        assert threads_a == [2]
        with b.computing():
            assert threads_b == [1]
            assert a.adjust() == 1  # a's next layer drops to its share
        assert a.adjust() == 2  # b is done: a takes both again
    assert threads_a == [2, 1, 2]
    assert a.busy_instances() == 1 and not a.rows[:, 0].any()


def test_an_instance_that_died_mid_pass_stops_counting(tmp_path):
    (a, b), _ = shares(tmp_path)
    b.stale_ns = a.stale_ns = int(0.001 * 1e9)
    b.rows[b.index] = (1, 0)  # busy since the clock's start: its stub is gone
    with a.computing():
        assert a.threads() == 2


def test_threads_never_drop_below_one(tmp_path):
    shared, _ = shares(tmp_path, instances=4, cores=2)
    for share in shared:
        share.rows[share.index] = (1, time.monotonic_ns())
    with shared[0].computing():
        assert shared[0].threads() == 1


def test_attach_adjusts_before_every_layer_of_the_stack(tmp_path):
    (a, _), (threads_a, _) = shares(tmp_path)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)]))
    a.attach(model)
    with a.computing():
        a.rows[1] = (1, time.monotonic_ns())  # another instance starts mid-pass
        outputs = [layer(torch.ones(1, 4)) for layer in model[1]]
    assert threads_a == [2, 1]  # the first layer already ran on its share
    assert all(o.shape == (1, 4) for o in outputs)  # the hook leaves the layers' inputs alone


def test_index_outside_the_table_is_refused(tmp_path):
    rows = open_rows(table_path("encoder", os.getpid(), tmp_path, kind="cores"), 2, 2)
    with pytest.raises(ValueError, match="outside"):
        CoreShare(rows, 2, 2)
