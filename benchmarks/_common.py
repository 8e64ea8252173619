"""Shared pieces of the benchmark suite: timing, memory, the machine line and the tables."""

from __future__ import annotations

import os
import platform
import re
import resource
import time
from dataclasses import dataclass, field


def best_time(fn, *, min_time: float = 0.3, min_reps: int = 2, max_reps: int = 20) -> float:
    """The fastest of several calls of ``fn`` (after one warm-up call that also compiles), in seconds.

    ``fn`` must block until its result is ready (``block_until_ready``). The minimum
    is the estimate least disturbed by other processes on a shared machine; every
    entry of a ratio is measured the same way, in the same run.
    """
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < min_reps or (len(times) < max_reps and time.perf_counter() - start < min_time):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def best_times(fns: dict, *, min_time: float = 0.5, min_reps: int = 3, max_reps: int = 20):
    """The fastest call of each of several functions, measured in interleaved rounds.

    One warm-up call each (compilation), then rounds that call every function once,
    so that all of them see the same load on a shared machine: their ratios are
    then far steadier than those of back-to-back measurements.

    Returns:
        ``(wall, cpu)``: two dicts of seconds, the best wall-clock time and the best
        CPU time of this process (all its threads) per call. CPU time hardly depends
        on other processes' load; wall time is what a user waits.
    """
    for fn in fns.values():
        fn()
    wall = {k: float("inf") for k in fns}
    cpu = dict(wall)
    start, reps = time.perf_counter(), 0
    while reps < min_reps or (reps < max_reps and time.perf_counter() - start < min_time * len(fns)):
        for k, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[k] = min(wall[k], time.perf_counter() - t0)
            cpu[k] = min(cpu[k], time.process_time() - c0)
        reps += 1
    return wall, cpu


class blas_threads:
    """Context manager: numpy's bundled OpenBLAS limited to ``n`` threads (a no-op if it cannot be found).

    ``available`` says whether the limit works. Used to give numpy its best chance: on a
    loaded machine one BLAS thread can be much faster than several spinning ones.
    """

    _set = _get = None
    _searched = False

    def __init__(self, n: int):
        self.n = n
        self._find()

    @classmethod
    def _find(cls):
        if cls._searched:
            return
        cls._searched = True
        import ctypes
        import glob

        import numpy as np

        root = os.path.dirname(os.path.dirname(np.__file__))
        for path in glob.glob(os.path.join(root, "numpy.libs", "*openblas*")) + glob.glob(
                os.path.join(root, "scipy_openblas*", "lib", "*openblas*.so*")):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for suffix in ("scipy_openblas_%s_num_threads64_", "openblas_%s_num_threads64_",
                           "scipy_openblas_%s_num_threads", "openblas_%s_num_threads"):
                if hasattr(lib, suffix % "set") and hasattr(lib, suffix % "get"):
                    cls._set, cls._get = getattr(lib, suffix % "set"), getattr(lib, suffix % "get")
                    cls._set.argtypes = [ctypes.c_int]
                    return

    @property
    def available(self) -> bool:
        return self._set is not None

    def __enter__(self):
        if self.available:
            self._old = self._get()
            self._set(self.n)
        return self

    def __exit__(self, *exc):
        if self.available:
            self._set(self._old)
        return False


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (``ru_maxrss``, KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if platform.system() == "Darwin" else peak * 1024


def available_memory_bytes() -> int:
    """Memory available for new allocations (``MemAvailable``), or a conservative 4 GiB if unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_line() -> str:
    """CPU model, cores, load, Python/jax/numpy versions and the jax device."""
    import jax
    import numpy as np

    dev = jax.devices()[0]
    kind = getattr(dev, "device_kind", str(dev))
    try:
        load = "load avg {:.1f}".format(os.getloadavg()[0])
    except OSError:
        load = "load avg ?"
    return (
        f"{cpu_model()}, {usable_cores()} cores ({load}); Python {platform.python_version()}, "
        f"jax {jax.__version__}, numpy {np.__version__}; device: {jax.default_backend()} ({kind}, "
        f"{jax.device_count()} device{'s' if jax.device_count() > 1 else ''})"
    )


def fmt_time(t: float | None) -> str:
    if t is None:
        return "—"
    if t < 1e-3:
        return f"{t * 1e6:.0f} µs"
    if t < 1:
        return f"{t * 1e3:.1f} ms"
    return f"{t:.2f} s"


def fmt_bytes(b: float | None) -> str:
    if b is None:
        return "—"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= scale:
            return f"{b / scale:.2f} {unit}" if unit == "GB" else f"{b / scale:.0f} {unit}"
    return f"{b:.0f} B"


def fmt_rate(r: float | None, unit: str = "/s") -> str:
    if r is None:
        return "—"
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if r >= scale:
            return f"{r / scale:.1f} {suffix}{unit}"
    return f"{r:.0f} {unit}"


def fmt_ratio(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.1e}×" if x >= 1e4 else f"{x:.1f}×" if x >= 1 else f"{x:.2f}×"


def fmt_err(e: float | None) -> str:
    return "—" if e is None else f"{e:.1e}"


@dataclass
class Table:
    """A titled table of strings, printed aligned as text or as Markdown."""

    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells) -> None:
        self.rows.append([str(c) for c in cells])

    def text(self) -> str:
        widths = [max(len(h), *(len(r[i]) for r in self.rows)) if self.rows else len(h)
                  for i, h in enumerate(self.headers)]
        line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w)  # noqa: E731
                                       for i, (c, w) in enumerate(zip(cells, widths)))
        out = [self.title, line(self.headers), line(["-" * w for w in widths])]
        out += [line(r) for r in self.rows]
        out += [f"  note: {n}" for n in self.notes]
        return "\n".join(out)

    def markdown(self, max_columns: int = 7) -> str:
        """The table in Markdown for the page: file names in backticks (``__init__.py`` would
        render as a bold "init.py"), columns of words aligned left, and a table wider than
        ``max_columns`` split in two that share the first column (the page's text column
        shows about seven)."""
        def esc(c):
            c = c.replace("|", "\\|")
            return f"`{c}`" if re.fullmatch(r"[\w./]+\.py", c) else c

        def align(j):  # words to the left, numbers (and the other columns) to the right
            words = j == 0 or (self.rows and all(r[j][:1].isalpha() for r in self.rows))
            return "---" if words else "---:"

        def block(title, cols):
            out = [f"### {title}", "", "| " + " | ".join(esc(self.headers[j]) for j in cols) + " |",
                   "|" + "|".join(align(j) for j in cols) + "|"]
            return out + ["| " + " | ".join(esc(r[j]) for j in cols) + " |" for r in self.rows]

        n = len(self.headers)
        if n <= max_columns:
            out = block(self.title, range(n))
        else:
            half = (n + 1) // 2
            out = block(self.title, range(half)) + [""] + block(
                f"{self.title}, continued", [0, *range(half, n)])
        if self.notes:
            out += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(out)


@dataclass
class Goal:
    """One goal of the benchmarks: what is asked, what was measured, and whether it was met."""

    name: str
    target: str
    measured: str
    met: bool | None  # None: not measured in this run
    section: str = ""  # the benchmark section that measured it (set by run.py)

    def status(self) -> str:
        return "not run" if self.met is None else "met" if self.met else "MISSED"


GOAL_HEADERS = ["section", "goal", "target", "measured", "status"]


def goals_table(goals: list[Goal], kept_rows: list[list[str]] = ()) -> Table:
    """The goals of this run, after ``kept_rows`` (rows of a page's goals table from sections not run now)."""
    t = Table("Goals", GOAL_HEADERS)
    t.rows += [list(r) for r in kept_rows]
    for g in goals:
        t.add(g.section, g.name, g.target, g.measured, g.status())
    return t
