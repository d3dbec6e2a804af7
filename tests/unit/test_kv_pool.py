"""The llama_cpp engine's cell pool (engines/kv_pool.py) against a model of llama.cpp's unified
cache: cells that belong to sets of sequences, shared by seq_cp and freed when no sequence holds
them. Its count of used cells equals the model's through any mix of sharing, growing, ending
and evicting; the longest held prefix is found; entries go least recently used first."""
import random

import pytest

from tritonfront.engines.kv_pool import BLOCK_TOKENS, CellPool, SlotTable


class UnifiedCache:
    """llama.cpp's cells as its llama_memory_seq_cp / seq_rm treat them: seq_id -> the cell of
    each of its positions, a cell being freed once no sequence has it."""

    def __init__(self):
        self.cells: dict[int, list[int]] = {}
        self.next_cell = 0
        self.calls = []

    def copy(self, source: int, target: int, count: int) -> None:
        self.calls.append(("copy", source, target, count))
        assert not self.cells.get(target), "a new seq_id starts empty"
        self.cells[target] = list(self.cells[source][:count])

    def remove(self, seq_id: int) -> None:
        self.calls.append(("remove", seq_id))
        self.cells.pop(seq_id, None)

    def compute(self, seq_id: int, count: int) -> None:
        self.cells.setdefault(seq_id, []).extend(range(self.next_cell, self.next_cell + count))
        self.next_cell += count

    def used(self) -> int:
        return len({cell for cells in self.cells.values() for cell in cells})


def pool_and_cache(capacity=10_000, seq_ids=16, reuse=True):
    cache = UnifiedCache()
    return CellPool(capacity, seq_ids, cache.copy, cache.remove, reuse), cache


def run(pool, cache, tokens, source=None, shared=0):
    """A request's holder that computes the rest of `tokens` after its shared prefix."""
    assert pool.take_seq_id(keep=source)
    holder = pool.start(tokens, source, shared)
    cache.compute(holder.seq_id, len(tokens) - shared)
    pool.grow(holder, len(tokens) - shared)
    return holder


def test_shared_cells_count_once_and_go_back_with_their_last_holder():
    pool, cache = pool_and_cache()
    system = list(range(100, 140))
    a = run(pool, cache, system + [1, 2, 3])
    assert pool.used == 43 == cache.used()
    source, shared = pool.find_prefix(system + [7, 8, 9], limit=42)
    assert source is a and shared == 40
    b = run(pool, cache, system + [7, 8, 9], source, shared)
    assert cache.calls[0] == ("copy", a.seq_id, b.seq_id, 40)
    assert pool.used == 46 == cache.used()
    assert pool.running_cells() == 46 and pool.entry_cells() == 0
    pool.release(a, keep=False)
    assert ("remove", a.seq_id) in cache.calls and pool.used == 43 == cache.used()
    pool.release(b, keep=True)  # an entry now
    assert pool.used == 43 and pool.entries == 1 and pool.entry_cells() == 43 and pool.running_cells() == 0


def test_the_longest_held_prefix_is_found_to_the_token_and_within_the_limit():
    pool, cache = pool_and_cache()
    tokens = list(range(1000, 1000 + 3 * BLOCK_TOKENS + 5))
    holder = run(pool, cache, tokens)
    assert pool.find_prefix(tokens[:2 * BLOCK_TOKENS + 3] + [1], limit=100) == (holder, 2 * BLOCK_TOKENS + 3)
    # At least the last token is fed: the limit is the prompt's length minus one.
    assert pool.find_prefix(tokens, limit=len(tokens) - 1) == (holder, len(tokens) - 1)
    assert pool.find_prefix(tokens + [5, 6], limit=len(tokens) + 1) == (holder, len(tokens))
    # Less than a whole block in common is not looked for; a different first block shares nothing.
    assert pool.find_prefix(tokens[:BLOCK_TOKENS - 1] + [7] * 40, limit=50) == (None, 0)
    assert pool.find_prefix([9] + tokens[1:], limit=60) == (None, 0)
    off, _ = pool_and_cache(reuse=False)
    assert off.find_prefix(tokens, limit=len(tokens)) == (None, 0)


def test_a_running_holder_is_found_for_what_it_has_computed_only():
    pool, cache = pool_and_cache()
    tokens = list(range(5, 5 + 4 * BLOCK_TOKENS))
    assert pool.take_seq_id()
    holder = pool.start(tokens, None, 0)
    cache.compute(holder.seq_id, BLOCK_TOKENS + 4)
    pool.grow(holder, BLOCK_TOKENS + 4)  # a prompt fed in chunks: its first chunk is in
    assert pool.find_prefix(tokens, limit=len(tokens) - 1) == (holder, BLOCK_TOKENS + 4)


def test_entries_are_evicted_least_recently_used_first_and_a_hit_refreshes_one():
    pool, cache = pool_and_cache(capacity=400, seq_ids=6)
    prompts = [[n] * 10 + list(range(40)) for n in range(4)]  # different from the first token
    entries = []
    for prompt in prompts:
        holder = run(pool, cache, prompt)
        pool.release(holder, keep=True)
        entries.append(holder.seq_id)
    assert pool.entry_ids() == entries and pool.used == 200 == cache.used()
    source, shared = pool.find_prefix(prompts[0] + [3], limit=len(prompts[0]))
    hit = run(pool, cache, prompts[0] + [3], source, shared)  # shares all of entry 0: refreshed
    assert pool.entry_ids() == entries[1:] + entries[:1]
    assert pool.make_room(250)  # 200 used, 1 new: two entries must go, the least recently used
    assert pool.entry_ids() == [entries[3], entries[0]] and pool.used == cache.used() == 101
    assert ("remove", entries[1]) in cache.calls and ("remove", entries[2]) in cache.calls
    # Entry 0's cells are shared by the running holder: evicting it frees none, and `keep` is spared.
    assert not pool.make_room(400, keep=pool._holders[entries[3]])
    assert pool.entry_ids() == [entries[3]] and pool.used == 101 == cache.used()
    pool.release(hit, keep=False)
    assert pool.make_room(400) and pool.used == 0 == cache.used() and pool.entries == 0


def test_seq_ids_beyond_the_running_ones_carry_entries_and_are_taken_back_when_none_is_free():
    pool, cache = pool_and_cache(seq_ids=3)
    for n in range(3):
        pool.release(run(pool, cache, [n] * 20), keep=True)
    assert pool.entries == 3 and pool.free_seq_ids() == 0
    assert pool.take_seq_id()  # evicts the oldest entry
    assert pool.entries == 2 and pool.free_seq_ids() == 1 and cache.calls[-1] == ("remove", 0)


def test_an_entry_whose_cells_a_later_one_all_shares_is_dropped():
    pool, cache = pool_and_cache()
    prompt = list(range(50))
    first = run(pool, cache, prompt)
    pool.release(first, keep=True)
    source, shared = pool.find_prefix(prompt, limit=len(prompt) - 1)
    assert source is first and shared == len(prompt) - 1
    again = run(pool, cache, prompt + [7, 8], source, shared)  # the last prompt token and two more
    pool.release(again, keep=True)
    # `first` held 50 cells, 49 of them shared: it still holds one of its own and stays.
    assert pool.entries == 2
    third = run(pool, cache, prompt + [7, 8, 9], *pool.find_prefix(prompt + [7, 8, 9], limit=52))
    pool.release(third, keep=True)
    assert pool.entries == 2 and first.seq_id in pool.entry_ids() and again.seq_id not in pool.entry_ids()
    assert pool.used == cache.used()


def test_without_reuse_every_end_frees_its_cells():
    pool, cache = pool_and_cache(reuse=False)
    holder = run(pool, cache, list(range(30)))
    pool.release(holder, keep=True)
    assert pool.used == 0 == cache.used() and pool.entries == 0 and pool.free_seq_ids() == 16


@pytest.mark.parametrize("seed", range(6))
def test_the_count_follows_llama_cpps_cells_through_random_traffic(seed):
    rng = random.Random(seed)
    pool, cache = pool_and_cache(capacity=1500, seq_ids=12)
    stems = [[rng.randrange(50) for _ in range(rng.randrange(10, 70))] for _ in range(4)]
    running = []
    for _ in range(400):
        action = rng.random()
        if action < 0.35 and len(running) < 5:
            tokens = list(rng.choice(stems)) + [rng.randrange(50) for _ in range(rng.randrange(1, 30))]
            source, shared = pool.find_prefix(tokens, limit=len(tokens) - 1)
            if not pool.make_room(len(tokens) - shared, keep=source):
                continue
            if not pool.take_seq_id(keep=source):
                continue
            holder = pool.start(tokens, source, shared)
            running.append(holder)
            if source is not None:
                assert source.tokens[:shared] == tokens[:shared]
        elif action < 0.8 and running:
            holder = rng.choice(running)
            count = min(rng.randrange(1, 12), len(holder.tokens) - holder.held)
            if count and pool.make_room(count):
                cache.compute(holder.seq_id, count)
                pool.grow(holder, count)
            elif not count:  # it generated a token: the list grows, as the engine's does
                holder.tokens.append(rng.randrange(50))
        elif running:
            holder = running.pop(rng.randrange(len(running)))
            pool.release(holder, keep=rng.random() < 0.7)
        else:
            pool.make_room(pool.capacity)
        assert pool.used == cache.used() <= pool.capacity
        assert pool.running_cells() == len({c for h in running for c in cache.cells.get(h.seq_id, [])})
        held = {seq_id for seq_id, cells in cache.cells.items() if cells}
        assert held <= {h.seq_id for h in running} | set(pool.entry_ids())


class SplitCache:
    """llama.cpp's cache split per seq_id: each stream the tokens of its positions; a stream is
    copied whole (then trimmed), as llama_memory_seq_cp does across streams."""

    def __init__(self, slots):
        self.streams = {slot: [] for slot in range(slots)}
        self.calls = []

    def copy(self, source, target, count):
        self.calls.append(("copy", source, target, count))
        self.streams[target] = list(self.streams[source][:count])

    def trim(self, slot, count):
        self.calls.append(("trim", slot, count))
        del self.streams[slot][count:]


def slot_run(table, cache, tokens):
    holder = table.start(tokens)
    cache.streams[holder.seq_id] += tokens[holder.held:]
    table.grow(holder, len(tokens) - holder.held)
    assert cache.streams[holder.seq_id] == tokens
    return holder


def test_a_slot_keeps_its_prompt_in_place_or_copies_a_longer_one_from_another_slot():
    cache = SplitCache(4)
    table = SlotTable(4, cache.copy, cache.trim, reuse=True)
    system = list(range(200, 240))
    first = slot_run(table, cache, system + [1, 2])
    second = slot_run(table, cache, [9] * 20)
    assert (first.seq_id, second.seq_id) == (0, 1)  # the lowest free slots
    table.release(first, keep=True)
    # Slot 0 is the lowest free one and keeps the 40 shared tokens: reused in place, nothing copied.
    third = table.start(system + [3, 4])
    assert third.seq_id == 0 and third.held == 40 and cache.calls[-1] == ("trim", 0, 40)
    cache.streams[0] += [3, 4]
    table.grow(third, 2)
    # A request on slot 2 copies the longest prefix another slot holds, running or kept.
    fourth = table.start(system + [3, 4, 5])
    assert fourth.seq_id == 2 and fourth.held == 42 and cache.calls[-1] == ("copy", 0, 2, 42)
    assert cache.streams[2] == system + [3, 4]
    assert table.free_slots() == 1


def test_a_slots_own_prompt_gives_way_to_a_longer_copy_and_nothing_is_kept_without_reuse():
    cache = SplitCache(3)
    table = SlotTable(3, cache.copy, cache.trim, reuse=True)
    long_prompt = list(range(64))
    a = slot_run(table, cache, long_prompt)
    b = slot_run(table, cache, long_prompt[:20] + [7] * 10)
    table.release(b, keep=True)  # slot 1 keeps 30 tokens, 20 of them shared with `a`
    c = table.start(long_prompt + [5])
    assert c.seq_id == 1 and c.held == 64 and ("copy", 0, 1, 64) in cache.calls
    assert cache.streams[1] == long_prompt and table.kept_cells() == 0
    off_cache = SplitCache(2)
    off = SlotTable(2, off_cache.copy, off_cache.trim, reuse=False)
    d = slot_run(off, off_cache, long_prompt)
    off.release(d, keep=True)
    assert off_cache.streams[0] == [] and off.kept_cells() == 0
    assert off.start(long_prompt).held == 0
