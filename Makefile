# Two commands on a fresh machine (Python >= 3.11): `make book` and `make test`.
# Both create .venv when it is missing and install requirements.txt and gmlib;
# the second time they reuse it (the install re-runs only when requirements change).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TOOLS  := $(VENV)/tools
CHAPTERS  := $(sort $(wildcard book/[0-9][0-9]_*.ipynb))
NOTEBOOKS := $(CHAPTERS) book/template.ipynb
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
# Chapters executed at once (tests/execute_chapters.py, tests/nbval_chapters.py): one kernel each.
EXEC_JOBS ?= $(JOBS)

.PHONY: book test unit nbval strict pdf lowest bench site-check twins format tools student assignments clean help

help:
	@echo "make book   build the HTML book into _build/html (executes every chapter)"
	@echo "make test   unit tests, then the strict build (every chapter executed once, its"
	@echo "            asserts checked), then nbval: every chapter executed again and its"
	@echo "            outputs compared with the build's (tests/nbval_sanitize.cfg)"
	@echo "make unit   the unit tests, the book's invariants and gmlib's docstring examples (no notebook executed)"
	@echo "make nbval NB=book/03_lda_landscape.ipynb   re-execute some notebooks through nbval,"
	@echo "            comparing outputs with the last build's where it has them (else only run)"
	@echo "make strict the strict build CI runs (warnings are errors, fresh execution)"
	@echo "make pdf    the whole book as one PDF, _build/latex/book.pdf, from the outputs the last"
	@echo "            \`make book\` or \`make strict\` cached (nothing executed again; installs TeX Live)"
	@echo "make lowest the smoke tests and chapter 1 at the lowest versions pyproject.toml declares"
	@echo "make bench  the benchmark table (ratios against baselines measured in the same run)"
	@echo "make site-check  open every page of the built book in headless Chromium (axe-core too)"
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
# more by nbval in strict mode, which compares the two executions' outputs.
test: unit
	$(MAKE) --no-print-directory strict
	$(MAKE) --no-print-directory nbval NB="$(CHAPTERS)"

# Test files are spread over TEST_JOBS processes (pytest-xdist, a whole file per process: the
# programs a file compiles are reused by its own tests); TEST_JOBS=0 runs them in this process.
TEST_JOBS ?= $(JOBS)
# Then every `>>>` example in gmlib's docstrings, run as written (conftest.py: float64, and the
# names the examples use unimported: jax, jnp, np, optax, gmlib, lda, denoise).
unit: $(STAMP) $(TOOLS)/.installed
	$(BIN)/python -m pytest tests -q -rs $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile)
	$(BIN)/python -m pytest --doctest-modules gmlib -q $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile)

# nbval in strict mode: each notebook is exported with the outputs the last build gave it (from
# _build/.jupyter_cache) into _build/nbval/, executed again (EXEC_JOBS at a time, another
# PYTHONHASHSEED, the build's cell timeout) and every output compared but images, after
# tests/nbval_sanitize.cfg. A notebook the cache lacks (never built, edited since, the
# template) is only executed. See tests/nbval_chapters.py.
NB ?= $(NOTEBOOKS)
nbval: $(STAMP)
	$(BIN)/python tests/nbval_chapters.py --jobs $(EXEC_JOBS) $(NB)

# The chapters are executed EXEC_JOBS at a time into the build's jupyter-cache (a failing
# chapter stops here, with its traceback); the build then reads every chapter from the cache.
strict: $(STAMP) $(MATHJAX)
	rm -rf _build
	$(BIN)/python tests/execute_chapters.py --jobs $(EXEC_JOBS)
	$(BIN)/jupyter-book build . --builder html -W -n --keep-going

# The PDF edition, _build/latex/book.pdf: Jupyter Book's `pdflatex` builder (sphinx-jupyterbook-
# latex, XeLaTeX; _config.yml's `latex` and `latex_elements`, book/_ext/pdf_edition.py), warnings
# are errors. It is made of the outputs the last `make book` or `make strict` left in the build's
# jupyter-cache, and never executes a chapter itself: pdf_edition.py first fails naming any
# chapter the cache lacks (the build would execute it). TeX Live and the fonts come from
# Debian's packages, installed when missing (as .ci/run installs Chromium), with sudo unless
# root: about 125 MB to download, 400 MB on disk. Not texlive-fonts-extra: 500 MB for the one
# package, bbm.sty, that sphinx-jupyterbook-latex loads and the book does not use (pdf_edition.py
# puts a stand-in in the LaTeX folder). poppler-utils reads the PDF back (tests/test_pdf.py).
# XeLaTeX never stops to ask (-halt-on-error); on an error the log's error lines are printed.
TEX_PACKAGES := texlive-xetex texlive-latex-recommended texlive-latex-extra texlive-fonts-recommended \
	latexmk xindy fonts-freefont-otf fonts-dejavu-core fonts-texgyre-math poppler-utils
pdf: $(STAMP)
	@missing=$$(for p in $(TEX_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); echo "installing" $$missing; \
		$$SUDO apt-get update -qq && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	$(BIN)/python book/_ext/pdf_edition.py
	LATEXOPTS=-halt-on-error LATEXMKOPTS=-silent $(BIN)/jupyter-book build . --builder pdflatex \
		-W -n --keep-going || { grep -s -A4 '^!' _build/latex/book.log; exit 1; }
	@echo ""
	@echo "The PDF is at: $(CURDIR)/_build/latex/book.pdf"

# The lower bounds pyproject.toml declares, tested: a fresh venv with gmlib's own dependencies
# at exactly those versions (tests/lowest_constraints.py; everything else at the newest version
# compatible with them), then the smoke tests (`-m smoke`, in the files that mark some) and
# chapter 1, executed through nbval-lax (other versions print other digits: nothing compared).
LOWEST := $(VENV)/lowest
lowest:
	rm -rf $(LOWEST) && $(PYTHON) -m venv $(LOWEST)
	$(PYTHON) tests/lowest_constraints.py > $(LOWEST)/constraints.txt
	$(LOWEST)/bin/python -m pip install -q --disable-pip-version-check -c $(LOWEST)/constraints.txt \
		-e . pytest hypothesis nbval ipykernel
	$(LOWEST)/bin/python -m pip list --disable-pip-version-check 2>/dev/null | \
		grep -i -E '^(jax|jaxlib|numpy|scipy|matplotlib|optax|tqdm) '
	$(LOWEST)/bin/python -m pytest -m smoke -q $$(grep -l "pytest.mark.smoke" tests/test_*.py)
	env -u MPLBACKEND $(LOWEST)/bin/python -m pytest book/01_gaussian_prompts.ipynb --nbval-lax \
		--nbval-current-env --nbval-cell-timeout=600 -q

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

# axe-core, the accessibility engine the site check runs on every page (light and dark),
# fetched once from npm as MathJax is; only its one script is kept.
AXE := _axe/axe.min.js
AXE_VERSION := 4.14.1
$(AXE):
	rm -rf _axe && mkdir -p _axe/.pack
	cd _axe/.pack && { npm pack -q axe-core@$(AXE_VERSION) >/dev/null 2>&1 || \
		curl -fsSLO https://registry.npmjs.org/axe-core/-/axe-core-$(AXE_VERSION).tgz; }
	tar -xzf _axe/.pack/axe-core-$(AXE_VERSION).tgz -C _axe/.pack
	mv _axe/.pack/package/axe.min.js _axe/ && rm -rf _axe/.pack

site-check: $(STAMP) $(AXE)
	$(BIN)/python tests/site_check.py

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
