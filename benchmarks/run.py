"""The benchmark table of gmlib and the book: ratios against baselines, measured side by side in one run.

Usage (``make bench`` runs the first line)::

    python benchmarks/run.py                       # everything
    python benchmarks/run.py --quick               # small sizes: a smoke test in about a minute
    python benchmarks/run.py --only attention,lda  # some sections (api, attention, lda, denoise, book)
    python benchmarks/run.py --markdown book/benchmarks.md  # also refresh the book's appendix page
    python benchmarks/run.py --only book --make-test               # also time a fresh `make test`

Sections: (0) the weight of validation: its share of gmlib's statements and the overhead of
a small public call against the same call inside ``jax.jit``; (1) finite softmax attention
against numpy and gmlib's unblocked path,
time and memory; (2) the LDA risk by quadrature, accuracy and throughput, against
Monte Carlo; (3) the denoising excess risk by quadrature; (4) the book's notebooks;
(5) on a GPU or TPU, the attention throughput as a fraction of the device's peaks and
the largest prompt that fits. Sections whose module is missing print a skip line.
Timings on a shared machine are noisy: compare the ratios, which are measured in
the same run, rather than absolute times across runs.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SECTIONS = ("api", "attention", "lda", "denoise", "book")


START, END = "% benchmarks:start", "% benchmarks:end"


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

    from _common import goals_table, machine_line

    machine = machine_line()
    print(f"machine: {machine}", flush=True)
    start = time.perf_counter()
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    tables, goals = [], []
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
        log(f"  ({time.perf_counter() - t0:.0f} s)")
        tables += t
        goals += g
    if goals:
        tables.append(goals_table(goals))
    elapsed = time.perf_counter() - start

    print()
    print(f"machine: {machine}")
    for t in tables:
        print()
        print(t.text())
    print(f"\n(benchmarks took {elapsed:.0f} s{'; --quick' if args.quick else ''})")

    if args.markdown:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        flags = [a for a in (sys.argv[1:] if argv is None else argv) if a in ("--quick", "--make-test")]
        flags += [f"--only {','.join(only)}"] if len(only) < len(SECTIONS) else []
        cmd = " ".join(["python benchmarks/run.py", *flags])
        parts = [f"**Machine:** {machine}", "",
                 f"Measured {stamp} with `{cmd.strip()}` in {elapsed:.0f} s."]
        parts += ["", *sum(([t.markdown(), ""] for t in tables), [])]
        write_markdown(args.markdown, "\n".join(parts).rstrip() + "\n")
        print(f"Markdown tables written to {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
