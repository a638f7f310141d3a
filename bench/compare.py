"""dyper beside py-spy, pyinstrument, yappi and ddtrace: accuracy, overhead, yield, time to an answer.

    python bench/compare.py [--quick] [--repeats 5] [--seconds 4] [--programs flat,deep,...]
                            [--tools dyper-1%,py-spy,...] [--json FILE] [--reanalyse FILE]

Needs the tools: ``pip install -r bench/requirements.txt`` (py-spy, pyinstrument,
ddtrace; yappi comes with dyper). ``--quick`` is two repeats of about 1.5-s programs
and a shorter settling series: a few minutes.

By default the six single-purpose programs and the nine tools below without
ddtrace, dyper-native-B and dyper-gil-B. Issue 29's multi-threaded truths are asked for:

    python bench/compare.py --programs io-mix,deep8,native-mix,gc-alloc --no-stable \
        --tools dyper-0.1%,dyper-1%,dyper-5%,dyper-gil-1%,py-spy,ddtrace --repeats 3

The programs (bench/workloads/truth.py) record where their own CPU time went:
each judged function times its own work with the thread's CPU clock and counts
its calls. Every tool runs every program the same way, as a command around
``python truth.py PROGRAM --rounds N OUT``, in one shuffled order per repeat,
with runs of no tool among them:

- dyper at 0.1%, 1% and 5% (``dyper run -q --budget B -o prof.json``; the CLI
  hosts the monitor, so its CPU counts as the tool's); ``dyper-native-B`` and
  ``dyper-gil-B`` the same with ``DYPER_SAMPLER=native`` or ``gil`` (an agent
  without the native sampler falls back; the tables say which sampler each run
  said it ran, "not said" if the report does not say);
- ddtrace (Datadog's profiler, ``DD_PROFILING_ENABLED=true ddtrace-run python
  ...``, its defaults, its pprof files written locally: see env()), the CPU time
  of its stack samples per leaf function;
- py-spy ``record`` at 100 Hz, its default rate, blocking (its default: the
  target is paused for each sample) and ``--nonblocking``;
- pyinstrument at its default interval (1 ms), saving its session;
- yappi with the wall clock and with the CPU clock (``python -m yappi``).

Per tool and program:

- **slowdown**: the program's work-phase wall time over the median of its
  no-tool runs, minus one, median over repeats (min and max beside it);
- **tool CPU**: CPU seconds of the whole run (the program, and the tool's own
  processes: py-spy, dyper's monitor) over the no-tool median, per second of
  the no-tool program: an out-of-process sampler's core counts too. Each
  tool's start-up and shut-down (its CPU on a run that does no work, over the
  bare interpreter's, in every repeat) is taken out and shown on its own: a
  profiler of a long-running service pays it once;
- **samples**: stack samples (dyper, py-spy, pyinstrument) or profiler events
  (yappi: calls recorded);
- **CPU stacks/s**: the thread stacks a tool's CPU answer is made of, per second
  (dyper: its cpu samples; py-spy: stacks of threads not idle; ddtrace: stacks
  with CPU time; pyinstrument: its samples), and **per tool CPU-s**: that over
  the tool CPU (the mean over programs of each, divided);
- **share error**: each judged function's share of the judged functions' self
  time, tool against truth, in points (max and mean over functions; the median
  over repeats of each);
- **top-5 agreement**: the share of the truth's five largest (of those with
  at least 1% of the truth: a sleeping thread's functions are in no top five)
  that the tool's as many largest hold, 0-1;
- **rank correlation**: Spearman's, over the judged functions;
- **calls error** (dyper's cpu detailing and yappi count calls): the median
  over counted functions of |counted - true| / true, %.

Shares are over the judged functions only, on both sides: glue (loops,
calls, the clock reads, start-up) is in no truth, and a tool's figures for it
would otherwise shift every share by its size.

**Time to a stable answer**: the ``spread`` program (one function called
from eight places, nine functions in all) run for growing lengths of time
(0.5, 1, 2, 4, 8, 16 s) under each tool, once each, in one shuffled order. A
tool's answer is stable from the shortest length at which its top five (as a
set) is the same as at every longer length; the table says too whether that
final answer is the truth's top five, and the tool's slowdown on those runs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import pstats
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.overhead import log, machine_info  # noqa: E402
from dyper.monitor.pprof import profile_pb2  # noqa: E402

TRUTH = REPO / "bench" / "workloads" / "truth.py"
#: The programs run by default; MULTI_PROGRAMS are issue 29's multi-threaded truths (--programs).
DEFAULT_PROGRAMS = ("flat", "deep", "spread", "recursion", "threads", "native")
MULTI_PROGRAMS = ("io-mix", "deep8", "native-mix", "gc-alloc")
PROGRAMS = DEFAULT_PROGRAMS + MULTI_PROGRAMS
#: The tools run by default; the others on request (--tools): dyper with the native sampler asked
#: for (DYPER_SAMPLER=native), and Datadog's profiler (ddtrace).
DEFAULT_TOOLS = (
    "none",
    "dyper-0.1%",
    "dyper-1%",
    "dyper-5%",
    "py-spy",
    "py-spy-nonblocking",
    "pyinstrument",
    "yappi-wall",
    "yappi-cpu",
)
TOOLS = (
    *DEFAULT_TOOLS,
    "dyper-native-0.1%",
    "dyper-native-1%",
    "dyper-native-5%",
    "dyper-gil-0.1%",
    "dyper-gil-1%",
    "dyper-gil-5%",
    "ddtrace",
)
STABLE_PROGRAM = "spread"
STABLE_LENGTHS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
QUICK_STABLE_LENGTHS = (0.5, 1.0, 2.0, 4.0)
#: The runs that do no work (flat, no rounds): each tool's start-up and shut-down CPU.
STARTUP = "(start-up)"
#: One run's limit: a tool that slows a 4-s program 100 times is reported as failed, not waited for.
RUN_TIMEOUT_S = 600


@dataclass
class Answer:
    """What a tool said about one run: self time (or samples) per function name, counted calls, samples.

    ``samples`` is the tool's own count (dyper: snapshots of all threads; py-spy: stacks of
    threads not idle; ddtrace: thread stacks; yappi: calls); ``cpu_stacks`` the thread stacks
    its CPU answer is made of (None where there are none: yappi). ``sampler`` is the sampler
    dyper says it ran (None when the report does not say).
    """

    self_by_name: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    samples: int | None = None
    cpu_stacks: int | None = None
    sampler: str | None = None


# --- reading each tool's output ---------------------------------------------------------------


def parse_pyspy_raw(text: str) -> Answer:
    """py-spy's ``--format raw`` (collapsed stacks): ``frame;frame;leaf count`` per line.

    A frame reads ``name (file:line)``; the leaf's name takes the count.
    """
    out = Answer(samples=0)
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = stack.rsplit(";", 1)[-1]
        name = leaf.split(" (", 1)[0].strip()
        out.self_by_name[name] = out.self_by_name.get(name, 0.0) + int(count)
        out.samples = (out.samples or 0) + int(count)
    out.cpu_stacks = out.samples  # py-spy leaves idle threads out (no --idle)
    return out


def parse_pstats(path: Path) -> Answer:
    """A pstats file (yappi's ``-f pstat``): own time (tottime) and calls per function name."""
    st = pstats.Stats(str(path))
    out = Answer(samples=0)
    for (_file, _line, name), (cc, nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        # cProfile puts primitive calls first and all calls second; yappi's export
        # puts all calls first and the non-recursive ones second: all is the larger.
        calls = max(cc, nc)
        out.self_by_name[name] = out.self_by_name.get(name, 0.0) + tt
        out.calls[name] = out.calls.get(name, 0) + calls
        out.samples = (out.samples or 0) + calls
    return out


def parse_pyinstrument_session(session: Mapping[str, Any]) -> Answer:
    """pyinstrument's saved session (``-r pyisession``, JSON): one record per sample, its stack and its time.

    The leaf's function takes the time. Frame identifiers read
    ``function\\x00file\\x00line``, with attributes after a ``\\x01``
    (pyinstrument/frame_info.py).
    """
    records = session["frame_records"]
    out = Answer(samples=len(records), cpu_stacks=len(records))
    for frames, seconds in records:
        if not frames:
            continue
        leaf = frames[-1].split("\x01", 1)[0]
        name = leaf.split("\x00", 1)[0]
        out.self_by_name[name] = out.self_by_name.get(name, 0.0) + float(seconds)
    return out


def dyper_sampler(*processes: Mapping[str, Any]) -> str | None:
    """Which sampler dyper ran, from a report's or a profile's ``process``: the first that says.

    The agent's field ``sampler`` ({name, why}, or a name) if one carries it; else
    ``"native"`` if the native sampler's dropped reads (``dropped`` keys ``native_...``)
    are counted; else None: not said.
    """
    for process in processes:
        said = process.get("sampler")
        if isinstance(said, Mapping) and said.get("name"):
            return str(said["name"])
        if isinstance(said, str) and said:
            return said
    for process in processes:
        if any(str(k).startswith("native_") for k in process.get("dropped") or {}):
            return "native"
    return None


def parse_dyper_report(report: Mapping[str, Any], profile: Mapping[str, Any] | None = None) -> Answer:
    """``dyper report --json``: the cpu proflet's self samples and counted calls per function.

    ``profile`` (the ``-o`` file the report was made from) is read for the sampler only.
    """
    out = Answer(samples=int(report["process"].get("samples") or 0))
    for f in report["proflets"].get("cpu", {}).get("functions", []):
        out.self_by_name[f["name"]] = out.self_by_name.get(f["name"], 0.0) + float(f["self"])
        if f.get("calls") is not None:
            out.calls[f["name"]] = int(f["calls"])
    out.cpu_stacks = round(sum(out.self_by_name.values()))  # every cpu sample is some function's self
    out.sampler = dyper_sampler(report["process"], (profile or {}).get("process") or {})
    return out


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"


def decompress_pprof(data: bytes) -> bytes:
    """A pprof file's bytes as the protobuf: ddtrace 4 writes zstd, the pprof tools gzip, some none."""
    if data.startswith(GZIP_MAGIC):
        return gzip.decompress(data)
    if not data.startswith(ZSTD_MAGIC):
        return data
    try:
        import zstandard  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # the zstd command line does as well
        return subprocess.run(["zstd", "-dcq"], input=data, capture_output=True, check=True).stdout
    return bytes(zstandard.ZstdDecompressor().stream_reader(data).read())


def parse_pprof(data: bytes, cpu_type: str = "cpu-time", count_type: str = "cpu-samples") -> Answer:
    """A pprof profile (ddtrace's): the ``cpu_type`` values (CPU nanoseconds) per leaf function, in seconds.

    A sample's first location is its leaf, and a location's first line its innermost
    function. ``cpu_stacks`` counts the ``count_type`` of the samples with CPU time;
    ``samples`` the ``wall-samples`` (every thread's stack each time it looks) if the
    profile has them, else the same as ``cpu_stacks``. Samples of other kinds
    (allocations, locks) carry no CPU time and count in neither.
    """
    prof = profile_pb2.Profile()
    prof.ParseFromString(decompress_pprof(data))
    strings = prof.string_table
    kinds = [strings[t.type] for t in prof.sample_type]
    if cpu_type not in kinds:
        raise ValueError(f"no {cpu_type} in the profile's sample types: {kinds}")
    cpu_i = kinds.index(cpu_type)
    count_i = kinds.index(count_type) if count_type in kinds else None
    wall_i = kinds.index("wall-samples") if "wall-samples" in kinds else None
    names = {f.id: strings[f.name] for f in prof.function}
    leaf_of = {loc.id: (names.get(loc.line[0].function_id, "?") if loc.line else "?") for loc in prof.location}
    out = Answer(samples=0, cpu_stacks=0)
    walls = 0
    for sample in prof.sample:
        values = sample.value
        if wall_i is not None:
            walls += values[wall_i]
        if values[cpu_i] <= 0:
            continue
        out.cpu_stacks = (out.cpu_stacks or 0) + (values[count_i] if count_i is not None else 1)
        if not sample.location_id:
            continue
        name = leaf_of.get(sample.location_id[0], "?")
        out.self_by_name[name] = out.self_by_name.get(name, 0.0) + values[cpu_i] / 1e9
    out.samples = walls if wall_i is not None else out.cpu_stacks
    return out


def merge_answers(answers: list[Answer]) -> Answer:
    """One answer from several (a profiler that writes a file per upload interval)."""
    out = Answer(samples=0, cpu_stacks=0)
    for a in answers:
        for name, v in a.self_by_name.items():
            out.self_by_name[name] = out.self_by_name.get(name, 0.0) + v
        for name, n in a.calls.items():
            out.calls[name] = out.calls.get(name, 0) + n
        out.samples = (out.samples or 0) + (a.samples or 0)
        out.cpu_stacks = (out.cpu_stacks or 0) + (a.cpu_stacks or 0)
    return out


# --- scoring -------------------------------------------------------------------------------------


def shares(values: Mapping[str, float], names: list[str]) -> dict[str, float]:
    """Each name's part of the named total, 0-1 (all zero if the tool saw none of them)."""
    total = sum(max(0.0, values.get(n, 0.0)) for n in names)
    return {n: (max(0.0, values.get(n, 0.0)) / total if total > 0 else 0.0) for n in names}


def top(share: Mapping[str, float], k: int = 5) -> list[str]:
    """The k largest of those above zero (a tool that saw nothing names nothing), ties broken by name."""
    return [n for n, v in sorted(share.items(), key=lambda kv: (-kv[1], kv[0]))[:k] if v > 0]


def ranks(xs: list[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation; nan when either side is constant."""
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = math.sqrt(sum((x - ma) ** 2 for x in ra))
    vb = math.sqrt(sum((y - mb) ** 2 for y in rb))
    return cov / (va * vb) if va > 0 and vb > 0 else math.nan


#: The top five compared are those of the judged functions with at least this share of the
#: truth: a function that takes next to nothing (a sleeping thread's) is in no top five.
TOP_FLOOR = 0.01


def score_shares(want: Mapping[str, float], got: Mapping[str, float]) -> dict[str, Any]:
    """Share errors (points), top-5 agreement (0-1) and rank correlation, from shares (0-1) by name."""
    names = sorted(want)
    errors = [100 * abs(got.get(n, 0.0) - want[n]) for n in names]
    k = min(5, sum(want[n] >= TOP_FLOOR for n in names))
    return {
        "max_err": max(errors),
        "mean_err": statistics.fmean(errors),
        "top5": len(set(top(want, k)) & set(top(got, k))) / k if k else None,
        "rank_corr": spearman([want[n] for n in names], [got.get(n, 0.0) for n in names]),
    }


def score(truth: Mapping[str, Any], answer: Answer) -> dict[str, Any]:
    """One run's accuracy: share errors (points), top-5 agreement, rank correlation, calls error."""
    names = sorted(truth["truth_s"])
    got = shares(answer.self_by_name, names)
    counted = [
        abs(answer.calls[n] - truth["calls"][n]) / truth["calls"][n]
        for n in names
        if n in answer.calls and truth["calls"].get(n)
    ]
    return {
        **score_shares(shares(truth["truth_s"], names), got),
        "calls_err_pct": 100 * statistics.median(counted) if counted else None,
        "seen": sum(answer.self_by_name.get(n, 0.0) > 0 for n in names),
        "judged": len(names),
    }


def stable_from(lengths: list[float], tops: list[list[str]]) -> float | None:
    """The shortest length from which every longer run's top five (as a set) equals the longest run's."""
    if not lengths:
        return None
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    final = set(tops[order[-1]])
    since = lengths[order[-1]]
    for i in reversed(order):
        if set(tops[i]) != final:
            break
        since = lengths[i]
    return since


# --- running the tools -------------------------------------------------------------------------


@dataclass
class Run:
    program: str
    tool: str
    truth: dict[str, Any]
    answer: Answer | None
    cpu_s: float  # the whole run's CPU: program and tool processes
    error: str | None = None


def _bin(name: str, python: str) -> str:
    """A console script beside the Python that runs the bench, else on PATH."""
    beside = Path(python).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or name)


def command(tool: str, python: str, program_args: list[str], out: Path) -> list[str]:
    """The command line that runs the program under ``tool``, its output going to ``out``."""
    target = [python, str(TRUTH), *program_args]
    if tool == "none":
        return target
    if tool.startswith("dyper-"):
        budget = tool.rsplit("-", 1)[1]  # dyper-1%, dyper-native-1%: the sampler is asked for in env()
        return [_bin("dyper", python), "run", "-q", "--budget", budget, "-o", str(out), "--", *target]
    if tool == "ddtrace":
        return [_bin("ddtrace-run", python), *target]
    if tool.startswith("py-spy"):
        extra = ["--nonblocking"] if tool.endswith("nonblocking") else []
        return [_bin("py-spy", python), "record", "-r", "100", "-f", "raw", "-o", str(out), *extra, "--", *target]
    # the in-process profilers run the script themselves: python -m TOOL ... truth.py ARGS
    if tool == "pyinstrument":
        return [python, "-m", "pyinstrument", "-r", "pyisession", "-o", str(out), *target[1:]]
    if tool.startswith("yappi-"):
        clock = tool.split("-", 1)[1]
        return [python, "-m", "yappi", "-c", clock, "-f", "pstat", "-o", str(out), *target[1:]]
    raise ValueError(f"unknown tool {tool!r}: give some of {', '.join(TOOLS)}")


def env(tool: str, out: Path) -> dict[str, str]:
    """The run's environment: this one, and what the tool is configured with.

    dyper-native-B asks for the native sampler (an agent without it falls back to the
    GIL sampler and says so, see dyper_sampler), dyper-gil-B for the GIL sampler.
    ddtrace: its profiler on, its pprof files written locally rather than uploaded:
    ``DD_PROFILING_OUTPUT_PPROF`` (ddtrace 4.x, ddtrace/internal/settings/profiling.py,
    ``output_pprof``; the exporter writes PREFIX.PID.N.pprof, one per upload interval
    and one at exit), everything else its defaults (the stack, lock and memory collectors).
    """
    out_env = dict(os.environ)
    out_env.pop("DYPER_SAMPLER", None)  # dyper-B: the agent's default sampler
    if tool.startswith("dyper-native-"):
        out_env["DYPER_SAMPLER"] = "native"
    elif tool.startswith("dyper-gil-"):
        out_env["DYPER_SAMPLER"] = "gil"
    if tool == "ddtrace":
        out_env["DD_PROFILING_ENABLED"] = "true"
        out_env["DD_PROFILING_OUTPUT_PPROF"] = str(out)
    return out_env


def ddtrace_files(out: Path) -> list[Path]:
    """The pprof files ddtrace wrote with the prefix ``out``."""
    return sorted(out.parent.glob(f"{out.name}.*.pprof"))


def read_answer(tool: str, python: str, out: Path) -> Answer | None:
    if tool == "none":
        return None
    if tool.startswith("dyper-"):
        rep = subprocess.run(
            [_bin("dyper", python), "report", str(out), "--json", "--limit", "100000"],
            capture_output=True,
            text=True,
            check=True,
        )
        return parse_dyper_report(json.loads(rep.stdout), json.loads(out.read_text()))
    if tool == "ddtrace":
        files = ddtrace_files(out)
        if not files:
            raise FileNotFoundError(f"ddtrace wrote no {out.name}.*.pprof")
        return merge_answers([parse_pprof(f.read_bytes()) for f in files])
    if tool.startswith("py-spy"):
        return parse_pyspy_raw(out.read_text())
    if tool == "pyinstrument":
        return parse_pyinstrument_session(json.loads(out.read_text()))
    return parse_pstats(out)


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_one(tool: str, program: str, mode: list[str], python: str, tmp: Path) -> Run:
    """Run one program under one tool, and read the truth and the tool's answer."""
    truth_path = tmp / "truth.json"
    name = {"pyinstrument": "out.pyisession", "ddtrace": "ddprof"}
    out = tmp / name.get(tool, "out.json" if tool.startswith("dyper") else "out.txt")
    for p in (truth_path, out, *ddtrace_files(tmp / "ddprof")):
        p.unlink(missing_ok=True)
    cmd = command(tool, python, [program, *mode, str(truth_path)], out)
    c0 = children_cpu()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, timeout=RUN_TIMEOUT_S, env=env(tool, out))
    except subprocess.TimeoutExpired:
        return Run(program, tool, {}, None, children_cpu() - c0, error=f"over {RUN_TIMEOUT_S} s: stopped")
    cpu = children_cpu() - c0
    if proc.returncode != 0 or not truth_path.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return Run(program, tool, {}, None, cpu, error=f"exit {proc.returncode}: {tail[0]}")
    truth = json.loads(truth_path.read_text())
    try:
        answer = read_answer(tool, python, out)
    except Exception as e:  # a tool's unreadable output is one failed run, said in the table
        return Run(program, tool, truth, None, cpu, error=f"{type(e).__name__}: {e}")
    return Run(program, tool, truth, answer, cpu)


def calibrate(python: str, programs: list[str], seconds: float, tmp: Path) -> dict[str, int]:
    """Rounds per program for about ``seconds`` of work with no tool."""
    rounds = {}
    for p in programs:
        r = run_one("none", p, ["--seconds", str(min(seconds, 2.0))], python, tmp)
        if r.error:
            raise SystemExit(f"{p}: the program itself failed ({r.error})")
        rate = r.truth["rounds"] / max(r.truth["wall_s"], 1e-6)
        rounds[p] = max(1, round(rate * seconds))
        log(f"{p}: {rounds[p]} rounds (~{seconds:g} s)")
    return rounds


# --- the tables --------------------------------------------------------------------------------


def median_or_none(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else None


def per_tool_cpu(stacks_per_s: float | None, tool_cpu_per_s: float | None) -> float | None:
    """CPU stack samples per CPU second of the tool: None when its CPU is not above zero (noise)."""
    if stacks_per_s is None or tool_cpu_per_s is None or tool_cpu_per_s <= 0:
        return None
    return stacks_per_s / tool_cpu_per_s


def samplers_said(said: list[str | None]) -> str:
    """Which sampler the runs said they ran: "native", "gil", "native 2, not said 1"..."""
    counts: dict[str, int] = {}
    for s in said:
        key = s or "not said"
        counts[key] = counts.get(key, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def median_shares(runs: list[Mapping[str, float]]) -> dict[str, float]:
    """Each function's median share over runs (0 where a run did not name it)."""
    names = sorted({n for r in runs for n in r})
    return {n: statistics.median([r.get(n, 0.0) for r in runs]) for n in names} if runs else {}


def summarise(runs: list[dict[str, Any]], tools: list[str], programs: list[str]) -> dict[str, Any]:
    """Per program and tool: the medians over repeats of every figure; then per tool over programs."""
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    # Each tool's start-up: CPU of a run that does no work, over that of the bare interpreter.
    empty = {t: median_or_none([r["cpu_s"] for r in runs if r["program"] == STARTUP and r["tool"] == t]) for t in tools}
    startup = {
        t: (empty[t] - empty["none"]) if empty[t] is not None and empty["none"] is not None else 0.0 for t in tools
    }
    for p in programs:
        base = [r for r in runs if r["program"] == p and r["tool"] == "none" and not r["error"]]
        base_wall = median_or_none([r["wall_s"] for r in base])
        base_cpu = median_or_none([r["cpu_s"] for r in base])
        cells[p] = {}
        for t in tools:
            mine = [r for r in runs if r["program"] == p and r["tool"] == t]
            ok = [r for r in mine if not r["error"]]
            if not ok or not base_wall or base_cpu is None:
                cells[p][t] = {"runs": len(mine), "failed": len(mine) - len(ok), "errors": [r["error"] for r in mine]}
                continue
            slow = [100 * (r["wall_s"] / base_wall - 1) for r in ok]
            cell: dict[str, Any] = {
                "runs": len(mine),
                "failed": len(mine) - len(ok),
                "slowdown_pct": statistics.median(slow),
                "slowdown_min": min(slow),
                "slowdown_max": max(slow),
                "tool_cpu_per_s": statistics.median([(r["cpu_s"] - base_cpu - startup[t]) / base_wall for r in ok]),
            }
            if t != "none":
                for k in ("max_err", "mean_err", "top5", "rank_corr", "calls_err_pct"):
                    cell[k] = median_or_none([r["score"][k] for r in ok])
                cell["samples"] = median_or_none([r["samples"] for r in ok])
                cell["samples_per_s"] = median_or_none(
                    [r["samples"] / r["wall_s"] for r in ok if r["samples"] is not None]
                )
                cell["cpu_stacks_per_s"] = median_or_none(
                    [r["cpu_stacks"] / r["wall_s"] for r in ok if r.get("cpu_stacks") is not None]
                )
                cell["stacks_per_tool_cpu_s"] = per_tool_cpu(cell["cpu_stacks_per_s"], cell["tool_cpu_per_s"])
                cell["samplers"] = samplers_said([r.get("sampler") for r in ok]) if t.startswith("dyper") else None
                cell["shares"] = median_shares([r["shares"] for r in ok if "shares" in r])
            else:
                cell["shares"] = median_shares([r["truth"] for r in mine if "truth" in r])  # the truth's
            cells[p][t] = cell
    overall: dict[str, dict[str, Any]] = {}
    for t in tools:
        row: dict[str, Any] = {}
        for k in (
            "slowdown_pct",
            "tool_cpu_per_s",
            "max_err",
            "mean_err",
            "top5",
            "rank_corr",
            "calls_err_pct",
            "cpu_stacks_per_s",
        ):
            vals = [cells[p][t].get(k) for p in programs if cells[p][t].get(k) is not None]
            row[k] = statistics.fmean(vals) if vals else None
        # a ratio of the means: one program's near-zero tool CPU would make a mean of ratios meaningless
        row["stacks_per_tool_cpu_s"] = per_tool_cpu(row["cpu_stacks_per_s"], row["tool_cpu_per_s"])
        said = [r.get("sampler") for r in runs if r["tool"] == t and r["program"] in programs and not r["error"]]
        row["samplers"] = samplers_said(said) if t.startswith("dyper") else None
        row["startup_cpu_s"] = startup[t]
        overall[t] = row
    return {"cells": cells, "overall": overall}


def rescore(result: dict[str, Any]) -> dict[str, Any]:
    """The scores and the summary again from each run's stored shares (the calls error as stored)."""
    for row in result["runs"]:
        if "shares" in row and "truth" in row:
            row["score"].update(score_shares(row["truth"], row["shares"]))
    st = result["settings"]
    result["summary"] = summarise(result["runs"], st["tools"], st["programs"])
    return result


def fmt(x: Any, spec: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def tool_label(tool: str, row: Mapping[str, Any]) -> str:
    """The tool's name, with the sampler dyper said it ran: "dyper-native-1% (ran: gil)"."""
    said = row.get("samplers")
    return f"{tool} (ran: {said})" if said else tool


def print_tables(result: dict[str, Any]) -> None:
    s = result["summary"]
    tools = result["settings"]["tools"]
    m = result["machine"]
    print(
        f"\ndyper compare: {result['settings']['repeats']} interleaved repeats, programs of about "
        f"{result['settings']['seconds']:g} s; {m['cpu_model']}, {m['cores']} cores, Python {m['python']}, "
        f"dyper {m['dyper_commit']}"
    )
    if m.get("installed"):
        print(", ".join(f"{k} {v}" for k, v in m["installed"].items()))
    print("\nall programs (mean over programs of each program's median)\n")
    print(
        "| tool | slowdown % | tool CPU s/s | start-up CPU s | share error max / mean, points | top-5 agreement "
        "| rank corr | calls error % | CPU stacks/s | per tool CPU-s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for t in tools:
        o = s["overall"][t]
        print(
            f"| {tool_label(t, o)} | {fmt(o['slowdown_pct'], '.1f')} | {fmt(o['tool_cpu_per_s'], '.3f')} | "
            f"{fmt(o.get('startup_cpu_s'), '.2f')} | {fmt(o['max_err'], '.1f')} / {fmt(o['mean_err'], '.1f')} | "
            f"{fmt(o['top5'], '.2f')} | {fmt(o['rank_corr'], '.2f')} | {fmt(o['calls_err_pct'], '.1f')} | "
            f"{fmt(o.get('cpu_stacks_per_s'), ',.0f')} | {fmt(o.get('stacks_per_tool_cpu_s'), ',.0f')} |"
        )
    for p in result["settings"]["programs"]:
        print(f"\n{p}\n")
        print(
            "| tool | slowdown % [min, max] | tool CPU s/s | samples (per s) | share error max / mean | top-5 "
            "| rank corr | calls error % | CPU stacks/s | per tool CPU-s |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for t in tools:
            c = s["cells"][p][t]
            if "slowdown_pct" not in c:
                print(f"| {t} | failed {c['failed']} of {c['runs']}: {(c.get('errors') or ['?'])[0]} |||||||||")
                continue
            samples = "-" if c.get("samples") is None else f"{c['samples']:,.0f} ({c['samples_per_s']:,.0f})"
            failed = f" ({c['failed']} failed)" if c["failed"] else ""
            print(
                f"| {tool_label(t, c)}{failed} | {c['slowdown_pct']:.1f} [{c['slowdown_min']:.1f}, "
                f"{c['slowdown_max']:.1f}] | {c['tool_cpu_per_s']:.3f} | {samples if t != 'none' else '-'} | "
                f"{fmt(c.get('max_err'), '.1f')} / {fmt(c.get('mean_err'), '.1f')} | {fmt(c.get('top5'), '.2f')} | "
                f"{fmt(c.get('rank_corr'), '.2f')} | {fmt(c.get('calls_err_pct'), '.1f')} | "
                f"{fmt(c.get('cpu_stacks_per_s'), ',.0f')} | {fmt(c.get('stacks_per_tool_cpu_s'), ',.0f')} |"
            )
    print("\nshares of the judged functions, %: the truth (median over the no-tool runs) and each tool's (median)")
    for p in result["settings"]["programs"]:
        cells = s["cells"][p]
        names = sorted(cells["none"].get("shares") or {}, key=lambda n: -cells["none"]["shares"][n])
        if not names:
            continue
        shown = [t for t in tools if t != "none" and cells[t].get("shares") is not None]
        print(f"\n{p}\n")
        print("| function | truth | " + " | ".join(shown) + " |")
        print("|---" * (len(shown) + 2) + "|")
        for n in names:
            row = " | ".join(fmt(100 * cells[t]["shares"].get(n, 0.0), ".1f") for t in shown)
            print(f"| {n} | {100 * cells['none']['shares'][n]:.1f} | {row} |")
    st = result.get("stable")
    if st:
        print(f"\ntime to a stable answer ({STABLE_PROGRAM}: lengths {', '.join(f'{x:g}' for x in st['lengths'])} s)\n")
        print("| tool | stable from, s | its final top 5 is the truth's | slowdown % (median over lengths) |")
        print("|---|---|---|---|")
        for t, row in st["tools"].items():
            print(
                f"| {t} | {fmt(row['stable_from'], 'g')} | {'yes' if row['final_is_truth'] else 'no'} | "
                f"{fmt(row['slowdown_pct'], '.1f')} |"
            )


# --- main --------------------------------------------------------------------------------------


def rate(run: Run) -> float:
    """Rounds per second of work: the settling runs end on time, so their slowdown is a rate's."""
    return float(run.truth["rounds"]) / max(float(run.truth["wall_s"]), 1e-9)


def run_stable(python: str, tools: list[str], lengths: tuple[float, ...], seed: int, tmp: Path) -> dict[str, Any]:
    """The settling series: the spread program for growing lengths under every tool, shuffled."""
    order = [(t, x) for t in tools for x in lengths]
    random.Random(seed + 1).shuffle(order)
    got: dict[str, dict[float, Run]] = {}
    for i, (t, x) in enumerate(order, 1):
        log(f"settling {i}/{len(order)}: {t} for {x:g} s")
        got.setdefault(t, {})[x] = run_one(t, STABLE_PROGRAM, ["--seconds", str(x)], python, tmp)
    out: dict[str, Any] = {"lengths": list(lengths), "tools": {}}
    base = got.get("none", {})
    for t in tools:
        if t == "none":
            continue
        ok = {x: r for x, r in got[t].items() if r.answer is not None}
        xs = sorted(ok)
        tops = [top(shares(ok[x].answer.self_by_name, sorted(ok[x].truth["truth_s"]))) for x in xs]  # type: ignore[union-attr]
        truth_top = top(shares(ok[xs[-1]].truth["truth_s"], sorted(ok[xs[-1]].truth["truth_s"]))) if xs else []
        # Against the no-tool run of the same length.
        slow = [100 * (rate(base[x]) / rate(ok[x]) - 1) for x in xs if x in base and base[x].truth and rate(ok[x]) > 0]
        out["tools"][t] = {
            "stable_from": stable_from(xs, tops),
            "final_is_truth": bool(xs) and set(tops[-1]) == set(truth_top),
            "slowdown_pct": median_or_none(slow),
            "tops": {str(x): tp for x, tp in zip(xs, tops, strict=True)},
            "failed": [f"{x:g} s: {r.error}" for x, r in got[t].items() if r.answer is None],
        }
    return out


def installed(python: str) -> dict[str, str]:
    """What the runs use: the dyper that ``python`` imports (its checkout's commit), the peers' versions.

    And whether that dyper has a native sampler (``dyper.agent._native``, issue 29) to run
    when ``DYPER_SAMPLER=native`` asks for it.
    """
    code = (
        "import importlib.metadata as m, os, dyper\n"
        "print(os.path.dirname(os.path.dirname(os.path.realpath(dyper.__file__))))\n"
        "for d in ('dyper', 'ddtrace', 'py-spy', 'pyinstrument', 'yappi'):\n"
        "    try: print(d, m.version(d))\n"
        "    except m.PackageNotFoundError: pass\n"
        "try: import dyper.agent._native; print('dyper_native_sampler importable')\n"
        "except ImportError: print('dyper_native_sampler absent')\n"
    )
    # isolated (-I): no current folder on the path, whose dyper/ (a checkout's) would be the one imported
    got = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True)
    lines = got.stdout.splitlines()
    if got.returncode != 0 or not lines:
        return {}
    out = dict(line.split(" ", 1) for line in lines[1:])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=lines[0])
    out["dyper_checkout"] = lines[0]
    out["dyper_commit"] = commit.stdout.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 repeats of ~1.5-s programs, a short settling series")
    ap.add_argument("--repeats", type=int, default=None, help="runs of each tool on each program (default 5)")
    ap.add_argument("--seconds", type=float, default=None, help="length of each program with no tool (default 4)")
    ap.add_argument("--programs", default=",".join(DEFAULT_PROGRAMS), help=f"some of {', '.join(PROGRAMS)}")
    ap.add_argument("--tools", default=",".join(DEFAULT_TOOLS), help=f"some of {', '.join(TOOLS)}".replace("%", "%%"))
    ap.add_argument("--no-stable", action="store_true", help="leave out the time-to-a-stable-answer series")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--reanalyse", metavar="FILE", help="print the tables again from a --json file and stop")
    args = ap.parse_args(argv)
    if args.reanalyse:
        print_tables(rescore(json.loads(Path(args.reanalyse).read_text())))
        return 0
    repeats = args.repeats or (2 if args.quick else 5)
    seconds = args.seconds or (1.5 if args.quick else 4.0)
    programs = [p.strip() for p in args.programs.split(",") if p.strip()]
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    for p in programs:
        if p not in PROGRAMS:
            ap.error(f"unknown program {p!r}: give some of {', '.join(PROGRAMS)}")
    for t in tools:
        if t not in TOOLS:
            ap.error(f"unknown tool {t!r}: give some of {', '.join(TOOLS)}")
    if "none" not in tools:
        tools.insert(0, "none")
    missing = [
        name
        for name in ("py-spy", "ddtrace-run")
        if any(t.startswith(name.split("-run")[0]) for t in tools) and not Path(_bin(name, args.python)).exists()
    ]
    modules = [m for m in ("pyinstrument", "yappi") if any(t.startswith(m) for t in tools)]
    for m in modules:
        if subprocess.run([args.python, "-c", f"import {m}"], capture_output=True).returncode != 0:
            missing.append(m)
    if missing:
        ap.error(f"{' and '.join(missing)} missing: {args.python} -m pip install -r bench/requirements.txt")
    if any(t.startswith("py-spy") for t in tools) and os.geteuid() != 0:
        log("py-spy needs ptrace of its own child; if its runs fail, try sudo or kernel.yama.ptrace_scope=0")

    machine = machine_info(args.python)
    machine["installed"] = installed(args.python)
    log(f"machine: {machine['cpu_model']}, {machine['cores']} cores, Python {machine['python']}")
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dyper-compare-") as tmpname:
        tmp = Path(tmpname)
        rounds = calibrate(args.python, programs, seconds, tmp)
        plan = []
        rng = random.Random(args.seed)
        for r in range(repeats):
            batch = [(r, p, t) for p in [*programs, STARTUP] for t in tools]
            rng.shuffle(batch)
            plan += batch
        runs: list[dict[str, Any]] = []
        for i, (r, p, t) in enumerate(plan, 1):
            if p == STARTUP:
                run = run_one(t, "flat", ["--rounds", "0"], args.python, tmp)
                run.program = STARTUP
            else:
                run = run_one(t, p, ["--rounds", str(rounds[p])], args.python, tmp)
            row: dict[str, Any] = {
                "repeat": r,
                "program": p,
                "tool": t,
                "error": run.error,
                "cpu_s": run.cpu_s,
                "wall_s": run.truth.get("wall_s"),
                "samples": run.answer.samples if run.answer else None,
                "cpu_stacks": run.answer.cpu_stacks if run.answer else None,
                "sampler": run.answer.sampler if run.answer else None,
            }
            if run.answer is not None and p != STARTUP:
                row["score"] = score(run.truth, run.answer)
                row["shares"] = shares(run.answer.self_by_name, sorted(run.truth["truth_s"]))
                row["calls"] = {n: run.answer.calls[n] for n in run.truth["calls"] if n in run.answer.calls}
                row["true_calls"] = run.truth["calls"]
            if run.truth:
                row["truth"] = shares(run.truth["truth_s"], sorted(run.truth["truth_s"]))
            runs.append(row)
            done = time.monotonic() - t_start
            status = run.error or (
                f"{run.truth['wall_s']:.2f} s"
                + (f", error {row['score']['max_err']:.1f} pts" if "score" in row else "")
            )
            log(f"{i}/{len(plan)} ({done / 60:.1f} min): {p} under {t}: {status}")
        stable = None
        if not args.no_stable:
            stable = run_stable(
                args.python, tools, QUICK_STABLE_LENGTHS if args.quick else STABLE_LENGTHS, args.seed, tmp
            )
    result = {
        "machine": machine,
        "settings": {"repeats": repeats, "seconds": seconds, "programs": programs, "tools": tools, "rounds": rounds},
        "runs": runs,
        "summary": summarise(runs, tools, programs),
        "stable": stable,
        "minutes": (time.monotonic() - t_start) / 60,
    }
    print_tables(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
        log(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
