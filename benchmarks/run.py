"""The benchmark table of gmlib and the book: ratios against baselines, measured side by side in one run.

Usage (``make bench`` runs the first line)::

    python benchmarks/run.py                       # everything
    python benchmarks/run.py --quick               # small sizes: a smoke test in about a minute
    python benchmarks/run.py --only attention,lda  # some sections (api, attention, lda, denoise, book)
    python benchmarks/run.py --markdown book/benchmarks.md  # also refresh the book's appendix page
    python benchmarks/run.py --only api --markdown book/benchmarks.md  # refresh one section of it
    python benchmarks/run.py --only book --make-test               # also time a fresh `make test`

Sections: (0) the weight of validation: its share of gmlib's statement lines and the overhead
of a small public call against the same call inside ``jax.jit``; (1) finite softmax attention
against ``jax.nn.dot_product_attention``, the floor of its own operations, numpy and gmlib's
unblocked path, time and memory; (2) the LDA risk by quadrature, accuracy and throughput, against
Monte Carlo; (3) the denoising excess risk by quadrature; (4) the book's notebooks;
(5) on a GPU or TPU, the attention throughput as a fraction of the device's peaks and
the largest prompt that fits. Sections whose module is missing print a skip line.
Timings on a shared machine are noisy: compare the ratios, which are measured in
the same run, rather than absolute times across runs. With ``--markdown``, the page keeps
one block per section (``% section: NAME``), each with its own date, command and machine,
and one goals table: sections not run now keep their block and their goals.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import GOAL_HEADERS, goals_table  # noqa: E402

SECTIONS = ("api", "attention", "lda", "denoise", "book")


START, END = "% benchmarks:start", "% benchmarks:end"
SECTION, GOALS = "% section: ", "% goals"


def write_markdown(path: str, body: str) -> None:
    """Write ``body`` to ``path``; in a page with the two marker lines, replace only what lies between.

    So ``--markdown book/benchmarks.md`` refreshes the book's appendix page and keeps its prose.
    """
    if os.path.exists(path):
        with open(path) as fh:
            text = fh.read()
        if START in text and END in text.split(START, 1)[1]:
            head, rest = text.split(START, 1)
            tail = rest.split(END, 1)[1]
            body = f"{head}{START}\n\n{body}\n{END}{tail}"
    with open(path, "w") as fh:
        fh.write(body)


def read_region(path: str) -> tuple[dict[str, str], list[list[str]]]:
    """The section blocks (``% section: NAME`` to the next marker) and goal rows of a page's results.

    Returns ``({name: block text}, goal rows)``; empty for a page without the markers, or
    whose results were written before sections were marked.
    """
    if not os.path.exists(path):
        return {}, []
    with open(path) as fh:
        text = fh.read()
    if START not in text or END not in text.split(START, 1)[1]:
        return {}, []
    region = text.split(START, 1)[1].split(END, 1)[0]
    blocks, rows, name = {}, [], None
    for line in region.splitlines(keepends=True):
        if line.startswith(SECTION):
            name = line[len(SECTION):].strip()
            blocks[name] = ""
        elif line.startswith(GOALS):
            name = GOALS
        elif name == GOALS:
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if len(cells) == len(GOAL_HEADERS) and cells != GOAL_HEADERS and not set(cells[0]) <= set("-:"):
                rows.append(cells)
        elif name is not None:
            blocks[name] += line
    return blocks, rows


def markdown_region(sections: dict[str, tuple], path: str) -> str:
    """The results region of the page: each section's block (this run's, or the page's for sections
    not run now), then the goals of all of them. ``sections``: ``{name: (header, tables, goals)}``."""
    kept, kept_rows = read_region(path)
    parts, goals = [], []
    for name in SECTIONS:
        if name in sections:
            header, tables, section_goals = sections[name]
            block = "\n".join([header, "", *sum(([t.markdown(), ""] for t in tables), [])])
            goals += section_goals
        elif name in kept:
            block = kept[name].strip("\n") + "\n"
        else:
            continue
        parts.append(f"{SECTION}{name}\n\n{block.rstrip()}\n")
    rows = [r for r in kept_rows if r[0] not in sections]
    table = goals_table(goals, rows)
    table.rows.sort(key=lambda r: SECTIONS.index(r[0]) if r[0] in SECTIONS else len(SECTIONS))
    parts.append(f"{GOALS}\n\n{table.markdown()}\n")
    return "\n".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help="comma-separated sections to run, from: " + ", ".join(SECTIONS))
    parser.add_argument("--markdown", metavar="PATH", help="also write the tables as Markdown to PATH")
    parser.add_argument("--make-test", action="store_true",
                        help="with the book section, also time a fresh `make test` (slow)")
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        parser.error(f"--only: unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")

    import jax

    jax.config.update("jax_enable_x64", True)  # quadrature sections: float64; attention: explicit float32

    from _common import machine_line

    machine = machine_line()
    print(f"machine: {machine}", flush=True)
    start = time.perf_counter()
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    flags = [a for a in (sys.argv[1:] if argv is None else argv) if a in ("--quick", "--make-test")]
    flags += [f"--only {','.join(only)}"] if len(only) < len(SECTIONS) else []
    cmd = " ".join(["python benchmarks/run.py", *flags])
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results = {}  # name -> (header, tables, goals)
    for name in only:
        log(f"[{name}]")
        t0 = time.perf_counter()
        if name == "api":
            import bench_api as mod
            t, g = mod.run(args.quick, log)
        elif name == "attention":
            import bench_attention as mod
            t, g = mod.run(args.quick, log)
        elif name == "lda":
            import bench_lda as mod
            t, g = mod.run(args.quick, log)
        elif name == "denoise":
            import bench_denoise as mod
            t, g = mod.run(args.quick, log)
        else:
            import bench_book as mod
            t, g = mod.run(args.quick, log, make_test=args.make_test)
        seconds = time.perf_counter() - t0
        log(f"  ({seconds:.0f} s)")
        for goal in g:
            goal.section = name
        header = f"Measured {stamp} with `{cmd}` in {seconds:.0f} s. **Machine:** {machine}"
        results[name] = (header, t, g)
    elapsed = time.perf_counter() - start

    print()
    print(f"machine: {machine}")
    goals = [goal for _, _, g in results.values() for goal in g]
    for t in [t for _, ts, _ in results.values() for t in ts] + ([goals_table(goals)] if goals else []):
        print()
        print(t.text())
    print(f"\n(benchmarks took {elapsed:.0f} s{'; --quick' if args.quick else ''})")

    if args.markdown:
        write_markdown(args.markdown, markdown_region(results, args.markdown))
        print(f"Markdown tables of {', '.join(only)} written to {args.markdown} (other sections kept)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
