# Two commands on a fresh machine (Python >= 3.11): `make book` and `make test`.
# Both create .venv when it is missing and install requirements.txt and gmlib;
# the second time they reuse it (the install re-runs only when requirements change).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TOOLS  := $(VENV)/tools
NOTEBOOKS := $(sort $(wildcard book/[0-9][0-9]_*.ipynb)) book/template.ipynb
export JAX_PLATFORMS ?= cpu
# XLA's compilation dominates most chapters' and tests' time: compiled programs are kept on
# disk and reused by the next process that compiles the same program (the second execution of
# `make test`, a rebuild, chapters sharing programs). Every program is kept, however quick to
# compile: a chapter compiles hundreds of small ones (its eager operations), and loading them
# takes less than compiling them (chapter 5 re-executed in 0.7x the CPU time it took when only
# programs over 0.2 s were kept; JAX's default is 1 s). Delete .jax_cache to start cold.
export JAX_COMPILATION_CACHE_DIR ?= $(CURDIR)/.jax_cache
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS ?= 0
export PYTHONHASHSEED := 0
# Processes run side by side: one per core, at most 4 (a chapter's kernel peaks at about
# 3.5 GB). The work is CPU-bound throughout, so more than one per core gains nothing.
JOBS := $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 4 ? n : 4 )))
# Chapters executed at once (tests/execute_chapters.py, tests/reproducibility.py): one kernel each.
EXEC_JOBS ?= $(JOBS)

.PHONY: book test unit nbval strict bench site-check repro twins format tools student assignments clean help

help:
	@echo "make book   build the HTML book into _build/html (executes every chapter)"
	@echo "make test   unit tests, then the strict build (every chapter executed once, its"
	@echo "            asserts checked), then a second execution compared with the first"
	@echo "make unit   the unit tests and the book's invariants only (no notebook executed)"
	@echo "make nbval NB=book/03_lda_landscape.ipynb   execute some notebooks through nbval"
	@echo "make strict the strict build CI runs (warnings are errors, fresh execution)"
	@echo "make bench  the benchmark table (ratios against baselines measured in the same run)"
	@echo "make repro  re-execute every chapter and compare its text outputs with the last build"
	@echo "make site-check  open every page of the built book in headless Chromium"
	@echo "make twins  regenerate each chapter's .ipynb from its MyST .md twin"
	@echo "make format ruff-format the code cells of every twin (book/ruff.toml), then make twins"
	@echo "make student  the chapters without solutions, _build/student/NN_*.ipynb, each executed"
	@echo "make assignments  an otter-grader assignment per chapter, _build/assignments/NN_*/dist"

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

# jupyter-cache keys on notebook code only: clear it whenever gmlib changes.
_build/.gmlib-stamp: $(wildcard gmlib/*.py)
	rm -rf _build/.jupyter_cache
	mkdir -p _build && touch $@

# MathJax 3, served from the built site (not a CDN): formulas render offline, and the browser
# check sees what an offline reader sees. Fetched once (npm, or the npm registry's tarball);
# only the CommonHTML build the pages load is kept, with what it loads on demand.
MATHJAX := _mathjax/es5/tex-mml-chtml.js
MATHJAX_VERSION := 3.2.2
$(MATHJAX):
	rm -rf _mathjax && mkdir -p _mathjax/.pack
	cd _mathjax/.pack && { npm pack -q mathjax@$(MATHJAX_VERSION) >/dev/null 2>&1 || \
		curl -fsSLO https://registry.npmjs.org/mathjax/-/mathjax-$(MATHJAX_VERSION).tgz; }
	tar -xzf _mathjax/.pack/mathjax-$(MATHJAX_VERSION).tgz -C _mathjax/.pack
	mkdir -p _mathjax/es5/output
	cd _mathjax/.pack/package/es5 && mv tex-mml-chtml.js input a11y ui adaptors sre ../../../es5/ && \
		mv output/chtml output/chtml.js ../../../es5/output/
	rm -rf _mathjax/.pack

book: $(STAMP) _build/.gmlib-stamp $(MATHJAX)
	$(BIN)/python tests/execute_chapters.py --jobs $(EXEC_JOBS)
	$(BIN)/jupyter-book build . --builder html
	@echo ""
	@echo "The book is at: file://$(CURDIR)/_build/html/index.html"

# The command-line checks of the publishing metadata, each in a venv of its own (cffconvert
# pins an old jsonschema that the book's stack cannot use).
$(TOOLS)/.installed: | $(STAMP)
	for t in cffconvert check-jsonschema; do \
		test -x $(TOOLS)/$$t/bin/$$t || { $(PYTHON) -m venv $(TOOLS)/$$t && \
		$(TOOLS)/$$t/bin/python -m pip install -q --disable-pip-version-check $$t; } || exit 1; \
	done
	touch $@

tools: $(TOOLS)/.installed

# Every chapter is executed once for the strict build (its asserts fail the build), and once
# more by the reproducibility check, which compares the two executions' text outputs.
test: unit
	$(MAKE) --no-print-directory strict
	$(MAKE) --no-print-directory repro

# Test files are spread over TEST_JOBS processes (pytest-xdist, a whole file per process: the
# programs a file compiles are reused by its own tests); TEST_JOBS=0 runs them in this process.
TEST_JOBS ?= $(JOBS)
unit: $(STAMP) $(TOOLS)/.installed
	$(BIN)/python -m pytest tests -q -rs $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile)

NB ?= $(NOTEBOOKS)
nbval: $(STAMP)
	$(BIN)/python -m pytest $(NB) --nbval-lax --nbval-current-env --nbval-cell-timeout=600 -q

# The chapters are executed EXEC_JOBS at a time into the build's jupyter-cache (a failing
# chapter stops here, with its traceback); the build then reads every chapter from the cache.
strict: $(STAMP) $(MATHJAX)
	rm -rf _build
	$(BIN)/python tests/execute_chapters.py --jobs $(EXEC_JOBS)
	$(BIN)/jupyter-book build . --builder html -W -n --keep-going

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

site-check: $(STAMP)
	$(BIN)/python tests/site_check.py

repro: $(STAMP)
	$(BIN)/python tests/reproducibility.py --jobs $(EXEC_JOBS)

twins: $(STAMP)
	for md in book/[0-9][0-9]_*.md book/template.md; do \
		$(BIN)/jupytext --to ipynb --update "$$md" -o "$${md%.md}.ipynb" >/dev/null || exit 1; \
	done

format: $(STAMP)
	$(BIN)/python tests/format_chapters.py
	$(MAKE) --no-print-directory twins

# The teacher's edition (book/course.md, book/_ext/course.py): student notebooks, executed
# EXEC_JOBS at a time (a failing one fails the target), and otter-grader assignments, made
# with otter in a venv of its own (it brings ipywidgets, which turns the chapters' tqdm bars
# into widgets: kept out of the book's kernel); that venv also has the book's requirements,
# for `otter run` to grade a chapter locally (tests/test_course.py).
OTTER := $(TOOLS)/otter
$(OTTER)/.installed: requirements.txt | $(STAMP)
	test -x $(OTTER)/bin/python || $(PYTHON) -m venv $(OTTER)
	$(OTTER)/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt otter-grader==7.0.0
	touch $@

student: $(STAMP)
	$(BIN)/python book/_ext/course.py student --execute --jobs $(EXEC_JOBS)

assignments: $(OTTER)/.installed
	PYTHONPATH=$(CURDIR) $(OTTER)/bin/python book/_ext/course.py assignments

clean:
	rm -rf _build .jax_cache
