"""File boundaries one batch crosses: calls that go into a function defined in another file.

The ``small`` scenario of peers.py (``ArrayDataset``, batch 128), ``shuffle=True``,
at ``--workers`` workers (default 2).  A profile hook (``sys.setprofile``)
sees every call of the main process while the measured epochs are iterated,
and every call of each worker (installed by ``worker_init_fn``); a call
counts when the file of the function called differs from the caller's.  A
compiled module (``_ring``, ``_slots``, ...) counts as its file.  The profile
hook does not see calls of Cython functions: a second, opcode-level trace of
the project's Python code resolves the callable of each call instruction
(the names it is loaded by) and counts those that are compiled.  Calls made
inside compiled code (a ``_slots`` method calling into ``_ring``, or back into
Python: then counted as the nearest Python frame's) are partly unseen; the
list names what was seen.

Per batch, in steady state (after one warm-up epoch), split by side and by
whether the function called is the project's own (``netcl_loader``) or
another library's (NumPy, the standard library).  ``--list`` prints every
crossing with its count per batch.  Usage::

    python bench/boundaries.py [--workers 2] [--epochs 2] [--samples 60000] [--list]
"""
from __future__ import annotations

import argparse
import builtins
import collections
import dis
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peers import SEED, make_scenario  # noqa: E402

_PACKAGE = os.sep + "netcl_loader" + os.sep


def _where(code_file):
    """A short name for a file: ``netcl_loader/x.py`` for the project's, else the module."""
    if _PACKAGE in code_file:
        return "netcl_loader/" + code_file.rsplit(_PACKAGE, 1)[1]
    return os.path.basename(code_file)


def _c_home(fn):
    """The file a built-in function lives in: its module (or its object's type's module)."""
    self = getattr(fn, "__self__", None)
    mod = getattr(fn, "__module__", None)
    if mod is None and self is not None and not isinstance(self, type(sys)):
        mod = type(self).__module__
    elif mod is None and isinstance(self, type(sys)):
        mod = self.__name__
    if mod and mod.startswith("netcl_loader"):
        return "netcl_loader/" + mod.split(".", 1)[1] + " (compiled)"
    return f"<{mod or 'builtins'}>"


class Crossings:
    """Counts (caller file, called file, called function) over the calls it sees."""

    def __init__(self):
        self.counts = collections.Counter()

    def hook(self, frame, event, arg):
        if event == "call":
            caller = frame.f_back
            if caller is None:
                return
            src, dst = _where(caller.f_code.co_filename), _where(frame.f_code.co_filename)
            if src != dst:
                self.counts[(src, dst, frame.f_code.co_qualname)] += 1
        elif event == "c_call":
            src, dst = _where(frame.f_code.co_filename), _c_home(arg)
            if src != dst:
                self.counts[(src, dst, getattr(arg, "__qualname__", repr(arg)))] += 1


_MISSING = object()
_NULL = object()


def _compiled_home(fn):
    """``netcl_loader/x (compiled)`` for a Cython function or method of the project, else None."""
    f = getattr(fn, "__func__", fn)
    if type(f).__name__ != "cython_function_or_method":
        return None
    mod = getattr(fn, "__module__", None) or ""
    if not mod.startswith("netcl_loader"):
        return None
    return "netcl_loader/" + mod.split(".", 1)[1] + " (compiled)"


class CompiledCalls:
    """Counts calls from the project's Python code into its compiled (Cython) functions.

    At each PRECALL instruction (Python 3.11) the callable's instructions are
    found by stack effects (the ``argc`` arguments on top, the callable and its
    self/NULL below) and evaluated on the frame (loads of locals, globals,
    attributes and methods only; anything else is skipped).
    """

    def __init__(self, counts):
        self.counts = counts
        self.code = {}      # code -> its instructions
        self.resolvers = {}  # (code, offset) -> instructions of the callable, or None

    def trace(self, frame, event, arg):
        if event == "call" and _PACKAGE in frame.f_code.co_filename:
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            return self.local
        return None

    def adopt(self, frame):
        """Trace a frame already running (the worker loop, when the trace is installed)."""
        while frame is not None:
            if _PACKAGE in frame.f_code.co_filename:
                frame.f_trace_opcodes = True
                frame.f_trace_lines = False
                frame.f_trace = self.local
            frame = frame.f_back

    def local(self, frame, event, arg):
        if event != "opcode":
            return self.local
        code, off = frame.f_code, frame.f_lasti
        ins = self.resolvers.get((code, off), _MISSING)
        if ins is _MISSING:
            ins = self.resolvers[(code, off)] = self._callable_of(code, off)
        if ins is not None:
            try:
                fn = self._evaluate(ins, frame)
            except Exception:
                return self.local
            home = _compiled_home(fn)
            src = _where(code.co_filename)
            if home is not None and home != src:
                self.counts[(src, home, getattr(fn, "__qualname__", "?"))] += 1
        return self.local

    def _callable_of(self, code, off):
        got = self.code.get(code)
        if got is None:
            instrs = list(dis.get_instructions(code))
            got = self.code[code] = (instrs, _depths(instrs))
        instrs, depth = got
        idx = next((k for k, i in enumerate(instrs) if i.offset == off), None)
        if idx is None or instrs[idx].opname != "PRECALL" or depth[idx] is None:
            return None
        base = depth[idx] - instrs[idx].arg - 2  # the depth below the callable and self/NULL
        start = idx - 1
        while start >= 0 and depth[start] is not None and depth[start] > base:
            start -= 1
        if start < 0 or depth[start] != base:
            return None
        end = idx - 1
        for j in range(start, idx):
            if depth[j] == base + 2 and _effect(instrs[j], False) > 0:
                end = j - 1  # the first argument starts here
                break
        return instrs[start:end + 1]

    @staticmethod
    def _evaluate(ins, frame):
        stack = []
        for i in ins:
            op = i.opname
            if op == "PUSH_NULL":
                stack.append(_NULL)
            elif op in ("LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE"):
                stack.append(frame.f_locals[i.argval])
            elif op == "LOAD_GLOBAL":
                if i.arg & 1:
                    stack.append(_NULL)
                g = frame.f_globals
                stack.append(g[i.argval] if i.argval in g else getattr(builtins, i.argval))
            elif op in ("LOAD_ATTR", "LOAD_METHOD"):
                stack.append(getattr(stack.pop(), i.argval))
            elif op == "LOAD_CONST":
                stack.append(i.argval)
            else:
                raise ValueError(op)
        return next(x for x in reversed(stack) if x is not _NULL)


def _effect(i, jump):
    if i.opcode < dis.HAVE_ARGUMENT:
        return dis.stack_effect(i.opcode, jump=jump)
    return dis.stack_effect(i.opcode, i.arg or 0, jump=jump)


_NO_FALLTHROUGH = {"RETURN_VALUE", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD", "JUMP_BACKWARD",
                   "JUMP_BACKWARD_NO_INTERRUPT"}


def _depths(instrs):
    """The stack depth before each instruction (None where not reached from the entry)."""
    at = {i.offset: k for k, i in enumerate(instrs)}
    depth = [None] * len(instrs)
    depth[0], work = 0, [0]
    while work:
        k = work.pop()
        i = instrs[k]
        nexts = []
        if i.opname not in _NO_FALLTHROUGH:
            nexts.append((k + 1, _effect(i, False)))
        if i.opcode in dis.hasjrel or i.opcode in dis.hasjabs:
            nexts.append((at.get(i.argval), _effect(i, True)))
        for n, e in nexts:
            if n is not None and n < len(instrs) and depth[n] is None:
                depth[n] = depth[k] + e
                work.append(n)
    return depth


_worker_counter = None


class _WorkerProbe:
    """worker_init_fn: installs the hook in the worker and dumps its counts every batch."""

    def __init__(self, out_dir):
        self.out_dir = out_dir

    def __call__(self, worker_id):
        global _worker_counter
        _worker_counter = Crossings()
        path = os.path.join(self.out_dir, f"worker{worker_id}.json")
        made = [0]
        hook = _worker_counter.hook
        compiled = CompiledCalls(_worker_counter.counts)
        sys.settrace(compiled.trace)
        compiled.adopt(sys._getframe(1))

        def probe(frame, event, arg):
            hook(frame, event, arg)
            if event == "return" and frame.f_code.co_name == "publish" \
                    and frame.f_code.co_filename.endswith("_worker.py"):
                made[0] += 1
                if made[0] % 16 == 0:
                    rows = [[k[0], k[1], k[2], v] for k, v in _worker_counter.counts.items()]
                    with open(path + ".tmp", "w") as f:
                        json.dump({"batches": made[0], "rows": rows}, f)
                    os.replace(path + ".tmp", path)
        sys.setprofile(probe)


def _report(title, counts, batches, show):
    own = sum(v for k, v in counts.items() if k[1].startswith("netcl_loader/"))
    other = sum(counts.values()) - own
    print(f"{title}: {own / batches:.1f} crossings into the project's files and "
          f"{other / batches:.1f} into other libraries, per batch ({batches} batches)")
    if show:
        for (src, dst, name), v in sorted(counts.items(), key=lambda kv: -kv[1]):
            if v / batches >= 0.05:
                print(f"  {v / batches:6.2f}  {src} -> {dst}  {name}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=None)
    p.add_argument("--list", action="store_true", help="every crossing, per batch")
    args = p.parse_args(argv)
    from netcl_loader import DataLoader

    sc = make_scenario("small", n=args.samples)
    out_dir = tempfile.mkdtemp(prefix="boundaries-")
    probe = _WorkerProbe(out_dir) if args.workers else None
    main_counts = Crossings()
    compiled = CompiledCalls(main_counts.counts)
    batches = 0
    with DataLoader(sc.datasets["ArrayDataset"], batch_size=sc.batch_size, shuffle=True,
                    num_workers=args.workers, seed=SEED, worker_init_fn=probe,
                    multiprocessing_context="fork") as loader:
        for _ in loader:  # warm-up: pool started, slots sized, plans cached
            pass
        for _ in range(args.epochs):
            it = iter(loader)
            sys.setprofile(main_counts.hook)
            sys.settrace(compiled.trace)
            try:
                for batch in it:
                    batches += 1
                    del batch
            finally:
                sys.settrace(None)
                sys.setprofile(None)
    _report(f"main process, {args.workers} workers", main_counts.counts, batches, args.list)
    for name in sorted(os.listdir(out_dir)):
        with open(os.path.join(out_dir, name)) as f:
            got = json.load(f)
        counts = collections.Counter({tuple(r[:3]): r[3] for r in got["rows"]})
        _report(f"{name[:-5]} (all its batches, warm-up too)", counts, got["batches"], args.list)


if __name__ == "__main__":
    main()
