"""Which llama.cpp seq_id holds which KV cells, for the llama_cpp engine's two caches, and the
prompt prefixes kept for later requests (pure Python: the calls into llama.cpp that change cells
come in as callables, so the count and llama.cpp's cells change together).

A holder is one seq_id's cells: positions [0, held) of its tokens (a running request's, or an
ended one's kept as a cache entry). `PrefixIndex` finds, for a new prompt, the holder that holds
its longest prefix: every block of BLOCK_TOKENS tokens a holder holds is indexed by a hash
chained over the blocks before it (vLLM's scheme), a prompt walks its blocks down the index, and
the holder found deepest is checked and extended token by token (a llama.cpp cell is one token;
a hash collision shares nothing).

`CellPool` is the unified cache (kv_cache_tokens cells any sequence draws from). There
`llama_memory_seq_cp(src, dst, 0, n)` adds dst to the cells of src's positions [0, n) without
copying anything, and a cell is free again once no sequence holds it. The cells a holder computed
form a segment starting where its shared prefix ends; a holder refers to the segments of its
prefix up to where it stopped sharing them, and a segment's cells in use run from its start to
the furthest position any holder refers to (a holder always holds a prefix of its tokens, so what
it keeps of a segment is a prefix of the segment). Used cells are the sum over live segments:
what llama.cpp's cache holds, a shared cell once. Ended requests' cells stay as cache entries on
the seq_ids beyond the running ones, least recently used first out when cells or ids run short
(a hit refreshes its source).

`SlotTable` is the split cache (one slot of kv_slot_tokens cells per running sequence, each
attending over its own cells only). A slot is one llama.cpp stream: a prefix is taken from
another slot by copying that stream whole and trimming it (llama.cpp copies streams only whole),
or kept in place when the new request lands on the slot that holds it. New requests take the
lowest slot no request runs on, whatever it keeps: running slots stay compact, which the split
cache's speed depends on (engines/llama_cpp.py, _step), so a kept prompt lasts until its slot is
the lowest one free.
"""
from collections import OrderedDict
from typing import Callable, Optional

BLOCK_TOKENS = 16


class Holder:
    """One seq_id's cells: positions [0, held) of `tokens` (the list is the request's own, which
    grows as it generates; `held` never runs past it)."""

    __slots__ = ("seq_id", "tokens", "held", "refs", "hashes", "entry", "source", "shared")

    def __init__(self, seq_id: int, tokens: list[int], source: Optional["Holder"], shared: int):
        self.seq_id = seq_id
        self.tokens = tokens
        self.held = shared
        # CellPool: [segment, limit]: this holder's positions [segment.start, min(held, limit)) are
        # that segment's cells; the last is its own segment (limit None), made when it first computes.
        self.refs: list[list] = []
        self.hashes: list[int] = []  # chain hash of each whole block it holds, in the index
        self.entry = False  # a running request until it ends; then, kept, a cache entry
        self.source = source  # the holder it shared its prefix from, while it runs
        self.shared = shared


class PrefixIndex:
    """The whole blocks that holders hold, by chain hash."""

    def __init__(self):
        self._blocks: dict[int, dict[int, Holder]] = {}  # chain hash -> holders of that prefix, by seq_id

    def find(self, tokens: list[int], limit: int) -> tuple[Optional[Holder], int]:
        """The holder that holds the longest prefix of `tokens`, and how many tokens of it (at most
        `limit`); (None, 0) when none shares a whole block."""
        depth, chain, found = 0, 0, None
        for depth_next in range(1, min(limit, len(tokens)) // BLOCK_TOKENS + 1):
            start = (depth_next - 1) * BLOCK_TOKENS
            step = hash((chain, tuple(tokens[start:start + BLOCK_TOKENS])))
            holders = self._blocks.get(step)
            if not holders:
                break
            depth, chain, found = depth_next, step, holders
        if found is None:
            return None, 0
        whole = depth * BLOCK_TOKENS
        best, shared = None, 0
        for holder in found.values():  # the same whole blocks: each may go on a few tokens further
            extra, stop = 0, min(holder.held, limit) - whole
            while extra < stop and holder.tokens[whole + extra] == tokens[whole + extra]:
                extra += 1
            if best is None or whole + extra > shared:
                best, shared = holder, whole + extra
        if best.tokens[:whole] != tokens[:whole]:
            return None, 0  # a hash collision: nothing is shared
        return best, shared

    def inherit(self, holder: Holder, source: Holder, shared: int) -> None:
        """`holder` starts with `source`'s first `shared` positions."""
        holder.hashes = source.hashes[:shared // BLOCK_TOKENS]
        for step in holder.hashes:
            self._blocks[step][holder.seq_id] = holder

    def grow(self, holder: Holder) -> None:
        """Indexes the whole blocks `holder` came to hold."""
        chain = holder.hashes[-1] if holder.hashes else 0
        for block in range(len(holder.hashes), holder.held // BLOCK_TOKENS):
            start = block * BLOCK_TOKENS
            chain = hash((chain, tuple(holder.tokens[start:start + BLOCK_TOKENS])))
            holder.hashes.append(chain)
            self._blocks.setdefault(chain, {})[holder.seq_id] = holder

    def drop(self, holder: Holder) -> None:
        for step in holder.hashes:
            holders = self._blocks[step]
            del holders[holder.seq_id]
            if not holders:
                del self._blocks[step]
        holder.hashes = []


class _Segment:
    __slots__ = ("start", "ends", "live")

    def __init__(self, start: int):
        self.start = start
        self.ends: dict[int, int] = {}  # seq_id -> the position its hold on this segment ends at
        self.live = 0  # cells in use: the furthest end minus the start


class CellPool:
    """The unified cache: `capacity` cells and `seq_ids` llama.cpp sequence ids (those beyond the
    running requests carry cache entries). `share(src, dst, n)` makes seq_id dst share src's
    positions [0, n) (llama_memory_seq_cp); `clear(seq_id)` drops every cell of a seq_id
    (llama_memory_seq_rm). With `reuse` false, an ended request's cells go back at once and
    nothing is indexed."""

    def __init__(self, capacity: int, seq_ids: int, share: Callable[[int, int, int], None],
                 clear: Callable[[int], None], reuse: bool):
        self.capacity = capacity
        self.reuse = reuse
        self._share, self._clear = share, clear
        self.used = 0
        self._free_ids = list(range(seq_ids - 1, -1, -1))  # popped from the end: the lowest first
        self._holders: dict[int, Holder] = {}
        self._segments: set[_Segment] = set()
        self._entries: OrderedDict[int, Holder] = OrderedDict()  # least recently used first
        self._index = PrefixIndex()

    @property
    def free(self) -> int:
        return self.capacity - self.used

    @property
    def entries(self) -> int:
        return len(self._entries)

    def free_seq_ids(self) -> int:
        return len(self._free_ids)

    def entry_ids(self) -> list[int]:
        """Cache entries' seq_ids, least recently used first."""
        return list(self._entries)

    def find_prefix(self, tokens: list[int], limit: int) -> tuple[Optional[Holder], int]:
        """The holder of the longest prefix of `tokens` (at most `limit` of them), or (None, 0)."""
        return self._index.find(tokens, limit) if self.reuse else (None, 0)

    def take_seq_id(self, keep: Optional[Holder] = None) -> bool:
        """Whether a seq_id is free, evicting the least recently used entry (never `keep`) if
        none is."""
        if not self._free_ids:
            self._evict_one(keep)
        return bool(self._free_ids)

    def make_room(self, cells: int, keep: Optional[Holder] = None) -> bool:
        """Evicts least recently used entries (never `keep`) until `cells` are free; whether they are."""
        while self.free < cells and self._evict_one(keep):
            pass
        return self.free >= cells

    def start(self, tokens: list[int], source: Optional[Holder], shared: int) -> Holder:
        """A running request's holder on a free seq_id (take_seq_id first), sharing `source`'s
        first `shared` positions."""
        holder = Holder(self._free_ids.pop(), tokens, source, shared)
        self._holders[holder.seq_id] = holder
        if source is not None and shared:
            self._share(source.seq_id, holder.seq_id, shared)
            for segment, limit in source.refs:
                if segment.start >= shared:
                    break
                end = shared if limit is None else min(limit, shared)
                holder.refs.append([segment, end])
                segment.ends[holder.seq_id] = end  # within what the source holds: the segment's live cells stay
            self._index.inherit(holder, source, shared)
            if source.entry:
                self._entries.move_to_end(source.seq_id)
        return holder

    def grow(self, holder: Holder, count: int) -> None:
        """The holder's next `count` positions were computed into new cells."""
        if not holder.refs or holder.refs[-1][1] is not None:
            segment = _Segment(holder.held)
            self._segments.add(segment)
            holder.refs.append([segment, None])
        segment = holder.refs[-1][0]
        holder.held += count
        # Nobody shares past what this holder holds of its own segment: its end is the furthest.
        segment.ends[holder.seq_id] = holder.held
        segment.live += count
        self.used += count
        if self.reuse and holder.held // BLOCK_TOKENS > len(holder.hashes):
            self._index.grow(holder)

    def release(self, holder: Holder, keep: bool) -> None:
        """A running request ends: with `keep` (and reuse on) its cells stay as the newest cache
        entry, otherwise they go back. An entry all of whose cells this one shares is dropped:
        the new one finds all it would."""
        if keep and self.reuse and holder.held:
            holder.entry = True
            self._entries[holder.seq_id] = holder
            source = holder.source
            if (source is not None and source.entry and source.held <= holder.shared
                    and self._holders.get(source.seq_id) is source):
                self._drop(source)
        else:
            self._drop(holder)
        holder.source = None  # a chain of ended holders would keep every one's tokens alive

    def running_cells(self) -> int:
        """Cells that running requests hold: what evicting every entry would leave in use."""
        total = 0
        for segment in self._segments:
            furthest = segment.start
            for seq_id, end in segment.ends.items():
                if end > furthest and not self._holders[seq_id].entry:
                    furthest = end
            total += furthest - segment.start
        return total

    def entry_cells(self) -> int:
        """Cells held by cache entries and by no running request."""
        return self.used - self.running_cells()

    def _evict_one(self, keep: Optional[Holder]) -> bool:
        for holder in self._entries.values():
            if holder is not keep:
                self._drop(holder)
                return True
        return False

    def _drop(self, holder: Holder) -> None:
        self._clear(holder.seq_id)
        for segment, _ in holder.refs:
            del segment.ends[holder.seq_id]
            live = max(segment.ends.values(), default=segment.start) - segment.start
            self.used -= segment.live - live
            segment.live = live
            if not segment.ends:
                self._segments.discard(segment)
        self._index.drop(holder)
        self._entries.pop(holder.seq_id, None)
        del self._holders[holder.seq_id]
        holder.refs, holder.tokens, holder.source = [], [], None
        self._free_ids.append(holder.seq_id)
        self._free_ids.sort(reverse=True)


class SlotTable:
    """The split cache: `slots` slots (seq_ids) of their own. `copy(src, dst, n)` gives slot dst
    slot src's first n positions (its stream copied whole, then trimmed); `trim(seq_id, n)` keeps
    a slot's first n positions (0: none). With `reuse` false nothing is kept or copied."""

    def __init__(self, slots: int, copy: Callable[[int, int, int], None], trim: Callable[[int, int], None],
                 reuse: bool):
        self.reuse = reuse
        self._copy, self._trim = copy, trim
        self._running: dict[int, Holder] = {}
        self._kept: dict[int, Holder] = {}  # slot -> the ended request's holder it still holds
        self._slots = slots
        self._index = PrefixIndex()

    def free_slots(self) -> int:
        return self._slots - len(self._running)

    def kept_cells(self) -> int:
        return sum(holder.held for holder in self._kept.values())

    def start(self, tokens: list[int]) -> Holder:
        """A running request's holder on the lowest slot nobody runs on (one must be free), with
        the longest prefix of its tokens any slot holds (at least its last token is left to feed):
        the slot's own kept prompt in place, or a copy of another slot's."""
        slot = min(set(range(self._slots)) - set(self._running))
        source, shared = self._index.find(tokens, len(tokens) - 1) if self.reuse else (None, 0)
        kept = self._kept.pop(slot, None)
        if kept is not None:
            self._index.drop(kept)
            common, stop = 0, min(kept.held, len(tokens) - 1)
            while common < stop and kept.tokens[common] == tokens[common]:
                common += 1
            if common >= shared:
                source, shared = kept, common
        if source is not None and source is kept:
            self._trim(slot, shared)
        else:
            if kept is not None:
                self._trim(slot, 0)
            if shared:
                self._copy(source.seq_id, slot, shared)
        holder = Holder(slot, tokens, None, shared)
        if shared:
            self._index.grow(holder)
        self._running[slot] = holder
        return holder

    def grow(self, holder: Holder, count: int) -> None:
        holder.held += count
        if self.reuse and holder.held // BLOCK_TOKENS > len(holder.hashes):
            self._index.grow(holder)

    def release(self, holder: Holder, keep: bool) -> None:
        """A running request ends: with `keep` (and reuse on) its slot keeps what it holds for a
        later request, otherwise it is emptied."""
        del self._running[holder.seq_id]
        if keep and self.reuse and holder.held:
            self._kept[holder.seq_id] = holder
        else:
            self._index.drop(holder)
            self._trim(holder.seq_id, 0)
