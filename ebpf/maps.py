"""Map calls through libbpf.so.1 (ctypes), for what BCC's table API does one
syscall per entry: reading a large array in one or a few batches.

    >>> ring = array_slice(fd, start=65537, count=65537)     # doctest: +SKIP
"""

import contextlib
import ctypes
import os

from ebpf.errors import BpfError
from ebpf.testrun import libbpf


class _BatchOpts(ctypes.Structure):
    """struct bpf_map_batch_opts (libbpf bpf.h)."""

    _fields_ = [("sz", ctypes.c_size_t), ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


def array_slice(fd, start, count, value_type=ctypes.c_uint32, as_list=True):
    """Values [start, start + count) of an array map (u32 keys), with BPF_MAP_LOOKUP_BATCH:
    a batch resumes after the key its token names, so one that starts at `start` is given
    start - 1 (none for 0). A list, or (as_list=False) the ctypes array read into."""
    keys = (ctypes.c_uint32 * count)()
    values = (value_type * count)()
    got = 0
    token_in, token_out = ctypes.c_uint32(start - 1), ctypes.c_uint32()
    opts = _BatchOpts(sz=ctypes.sizeof(_BatchOpts))
    while got < count:
        n = ctypes.c_uint32(count - got)
        err = libbpf().bpf_map_lookup_batch(
            fd,
            ctypes.byref(token_in) if start + got > 0 else None,
            ctypes.byref(token_out),
            ctypes.byref(keys, got * 4),
            ctypes.byref(values, got * ctypes.sizeof(value_type)),
            ctypes.byref(n),
            ctypes.byref(opts),
        )
        got += n.value
        if err == -2 or n.value == 0:  # ENOENT: the map's end
            break
        if err:
            raise BpfError(f"reading map fd {fd} in batches: {os.strerror(-err)}")
        token_in.value = token_out.value
    if got != count:
        raise BpfError(f"map fd {fd}: {got} of {count} entries from {start}")
    return values[:got] if as_list else values  # a simple type's array slices to Python ints


def array_write(fd, keys, values, count=None, value_type=ctypes.c_uint32, chunk=65536) -> int:
    """Write values[i] at keys[i] of an array map (u32 keys) for the first `count` (all)
    of them, with BPF_MAP_UPDATE_BATCH, `chunk` entries a call (one call for a Maglev
    table), in the order given: a reader between two entries sees each slot old or new,
    never empty. keys and values: sequences, or ctypes arrays (written as they are)."""
    total = len(keys) if count is None else count
    if total > min(len(keys), len(values)):
        raise ValueError("fewer keys or values than entries to write")
    k = keys if isinstance(keys, ctypes.Array) else (ctypes.c_uint32 * total)(*keys)
    v = values if isinstance(values, ctypes.Array) else (value_type * total)(*values)
    opts = _BatchOpts(sz=ctypes.sizeof(_BatchOpts))
    done = 0
    while done < total:
        n = ctypes.c_uint32(min(chunk, total - done))
        err = libbpf().bpf_map_update_batch(
            fd,
            ctypes.byref(k, done * 4),
            ctypes.byref(v, done * ctypes.sizeof(value_type)),
            ctypes.byref(n),
            ctypes.byref(opts),
        )
        if err:
            raise BpfError(f"writing map fd {fd} in batches: {os.strerror(-err)}")
        done += n.value
    return done


def count_hash(fd, key_size, value_size, chunk=4096) -> int:
    """How many entries a hash map (an LRU's too) holds now, read in batches of `chunk`
    (BPF_MAP_LOOKUP_BATCH: a few syscalls for a table of 64k flows, where BCC's len()
    makes one per key). The batch token of a hash map is a bucket index (u32). A map
    that changes while it is read is counted as the batches met it."""
    keys = ctypes.create_string_buffer(key_size * chunk)
    values = ctypes.create_string_buffer(value_size * chunk)
    token_in, token_out = ctypes.c_uint32(), ctypes.c_uint32()
    opts = _BatchOpts(sz=ctypes.sizeof(_BatchOpts))
    total, first = 0, True
    while True:
        n = ctypes.c_uint32(chunk)
        err = libbpf().bpf_map_lookup_batch(
            fd,
            None if first else ctypes.byref(token_in),
            ctypes.byref(token_out),
            keys,
            values,
            ctypes.byref(n),
            ctypes.byref(opts),
        )
        total += n.value
        if err == -2:  # ENOENT: the map's end (n says what this last batch held)
            return total
        if err:
            raise BpfError(f"counting map fd {fd} in batches: {os.strerror(-err)}")
        token_in.value, first = token_out.value, False


class HashWalk:
    """A hash map (an LRU's too) read a part at a time across calls, with
    BPF_MAP_LOOKUP_BATCH: step(budget) returns the next entries from where the last
    step stopped, at least `budget` unless the map's end came first, and whether it
    did (the step after starts again at the first bucket). A map that changes while
    it is walked is read as the batches meet it: an entry added behind the walk is
    seen on its next pass, one deleted ahead of it not at all."""

    def __init__(self, fd, key_size, value_size, chunk=4096):
        self.fd, self.key_size, self.value_size, self.chunk = fd, key_size, value_size, chunk
        self.token_in, self.token_out = ctypes.c_uint32(), ctypes.c_uint32()
        self.first = True
        self.opts = _BatchOpts(sz=ctypes.sizeof(_BatchOpts))

    def restart(self):
        """The next step starts at the first bucket."""
        self.first = True

    def step(self, budget) -> tuple[memoryview, memoryview, int, bool]:
        """(keys, values, n, at_end): n entries' keys and values, packed, in buffers
        the next step reuses (copy what must outlive it)."""
        # a batch ends on a bucket's end, and one asked for fewer entries than the next bucket
        # holds is refused (ENOSPC): then it asks for more, into the room left
        ks, vs = self.key_size, self.value_size
        room = max(budget, self.chunk)
        if getattr(self, "room", 0) < room:  # allocated once: a tick's step allocates nothing
            self.room = room
            self.keys = ctypes.create_string_buffer(ks * room)
            self.values = ctypes.create_string_buffer(vs * room)
        keys, values = self.keys, self.values
        got, end, ask = 0, False, min(budget, self.chunk)
        while got < budget:
            n = ctypes.c_uint32(min(ask, self.room - got))
            err = libbpf().bpf_map_lookup_batch(
                self.fd,
                None if self.first else ctypes.byref(self.token_in),
                ctypes.byref(self.token_out),
                ctypes.byref(keys, got * ks),
                ctypes.byref(values, got * vs),
                ctypes.byref(n),
                ctypes.byref(self.opts),
            )
            if err == -28 and n.value == 0 and ask < self.room - got:  # ENOSPC: a bucket larger than asked
                ask *= 2
                continue
            got += n.value
            if err == -2:  # ENOENT: the map's end (n says what this last batch held)
                end, self.first = True, True
                break
            if err == -28:  # a bucket larger than the room left: the next step reads it
                break
            if err:
                raise BpfError(f"walking map fd {self.fd} in batches: {os.strerror(-err)}")
            self.token_in.value, self.first = self.token_out.value, False
            ask = min(budget - got, self.chunk) if budget > got else ask
        return memoryview(keys)[: got * ks], memoryview(values)[: got * vs], got, end


# --- tables on a map's descriptor -----------------------------------------------------------
# BCC's table API (bcc/table.py), the part the lab uses, on libbpf's map calls: every
# program's maps, made from its image (ebpf/images.py) without BCC. Keys and values are ctypes
# objects of the map's Key and Leaf types, as BCC's are.

# keyed, not indexed: HASH, PERCPU_HASH, LRU_HASH, LRU_PERCPU_HASH, LPM_TRIE, HASH_OF_MAPS, DEVMAP_HASH
HASHES = {1, 5, 9, 10, 11, 13, 25}
PER_CPU = {5, 6, 10}  # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH
BPF_ANY = 0


def possible_cpus() -> int:
    """How many CPUs a per-CPU value has a slot for: the kernel's possible CPUs, counted
    (num_possible_cpus(); "0-3,8-11" is 8, as BCC and libbpf count them)."""
    with open("/sys/devices/system/cpu/possible") as f:
        n = 0
        for part in f.read().strip().split(","):
            lo, _, hi = part.partition("-")
            n += int(hi or lo) - int(lo) + 1
        return n


class Table:
    """A map as BCC's table object: t[key], t[key] = value, del t[key], items(), keys(),
    len(), clear(), pop(); Key and Leaf are its types, map_fd its descriptor. An array's
    keys are its indices (an int does too), and deleting one zeroes it, as BCC does."""

    def __init__(self, fd, map_type, key, leaf, max_entries, name=""):
        self.map_fd, self.map_type, self.max_entries, self.name = fd, map_type, max_entries, name
        self.Key, self.Leaf = key, leaf
        self.map_id = name  # BCC's is its index in the module; here the name says which

    def close(self):
        """Let go of the map (its programs, and other descriptors, still hold it)."""
        if self.map_fd >= 0:
            os.close(self.map_fd)
            self.map_fd = -1

    def on_fd(self, fd):
        """The same types on another map's descriptor (one this process does not own)."""
        t = type(self).__new__(type(self))
        t.__dict__.update(self.__dict__)
        t.map_fd = fd
        return t

    def _key(self, key):
        if isinstance(key, int):
            if self.map_type in HASHES:
                raise TypeError(f"{self.name}: a hash map's key is a {self.Key.__name__}, not an int")
            if not 0 <= key < self.max_entries:
                raise IndexError(f"{self.name}: index {key} outside 0..{self.max_entries - 1}")
            return self.Key(key)
        return key

    def _call(self, what, err, key=None):
        if err == -2:  # ENOENT
            raise KeyError(key)
        if err:
            raise BpfError(f"{what} in map {self.name}: {os.strerror(-err)}")

    def __getitem__(self, key):
        key = self._key(key)
        value = self.Leaf()
        self._call("lookup", libbpf().bpf_map_lookup_elem(self.map_fd, ctypes.byref(key), ctypes.byref(value)), key)
        return value

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def __setitem__(self, key, value):
        key = self._key(key)
        self._call("update", libbpf().bpf_map_update_elem(self.map_fd, ctypes.byref(key), ctypes.byref(value), BPF_ANY))

    def __delitem__(self, key):
        key = self._key(key)
        if self.map_type not in HASHES:  # an array's entries cannot go: zeroed, as BCC does
            self[key] = self.Leaf()
            return
        self._call("delete", libbpf().bpf_map_delete_elem(self.map_fd, ctypes.byref(key)), key)

    def items_update_batch(self, keys, values):
        """Write len(keys) entries in one call (BPF_MAP_UPDATE_BATCH): keys and values are
        ctypes arrays of Key and Leaf, as BCC's method takes them."""
        n = ctypes.c_uint32(len(keys))
        opts = _BatchOpts(sz=ctypes.sizeof(_BatchOpts))
        err = libbpf().bpf_map_update_batch(self.map_fd, keys, values, ctypes.byref(n), ctypes.byref(opts))
        self._call("batch update", err)
        if n.value != len(keys):
            raise BpfError(f"batch update in map {self.name}: {n.value} of {len(keys)} entries written")

    def pop(self, key, *default):
        try:
            value = self[key]
            del self[key]
        except KeyError:
            if default:
                return default[0]
            raise
        return value

    def __contains__(self, key):
        return self.get(key) is not None

    def keys(self) -> list:
        if self.map_type not in HASHES:
            return [self.Key(i) for i in range(self.max_entries)]
        out, prev = [], None
        while True:
            nxt = self.Key()
            err = libbpf().bpf_map_get_next_key(
                self.map_fd, ctypes.byref(prev) if prev is not None else None, ctypes.byref(nxt)
            )
            if err == -2:  # ENOENT: the end
                return out
            self._call("next key", err)
            out.append(nxt)
            prev = nxt

    def __iter__(self):
        return iter(self.keys())

    def items(self) -> list:
        """(key, value) of every entry; one that goes while this reads is left out."""
        out = []
        for k in self.keys():
            v = self.get(k)
            if v is not None:
                out.append((k, v))
        return out

    def values(self) -> list:
        return [v for _, v in self.items()]

    def __len__(self):
        return len(self.keys())

    def clear(self):
        for k in self.keys():
            with contextlib.suppress(KeyError):
                del self[k]


class PerCpuTable(Table):
    """A per-CPU map: a value is one sLeaf per possible CPU (Leaf is that array), each
    slot 8-byte aligned by the kernel; a 4-byte int is read as its 8-byte slot, as BCC does."""

    def __init__(self, fd, map_type, key, leaf, max_entries, name=""):
        super().__init__(fd, map_type, key, leaf, max_entries, name)
        self.sLeaf, self.total_cpu = leaf, possible_cpus()
        if ctypes.sizeof(leaf) % 8 == 0:
            self.Leaf = leaf * self.total_cpu
        elif leaf in (ctypes.c_uint, ctypes.c_int):
            self.Leaf = (ctypes.c_uint64 if leaf is ctypes.c_uint else ctypes.c_int64) * self.total_cpu
        else:
            raise BpfError(f"map {name}: a per-CPU value must be 8-byte aligned ({leaf.__name__} is not)")

    def getvalue(self, key):
        got = self[key]
        if self.Leaf._type_ is self.sLeaf:
            return got
        out = (self.sLeaf * self.total_cpu)()
        for i in range(self.total_cpu):
            out[i] = got[i]
        return out


def table(fd, map_type, key, leaf, max_entries, name="") -> Table:
    return (PerCpuTable if map_type in PER_CPU else Table)(fd, map_type, key, leaf, max_entries, name)
