"""Author–year labels for the bibliography, matching the book's author–year citations.

sphinxcontrib-bibtex cites in the author–year style (``bibtex_reference_style:
author_year`` in ``_config.yml``: "Gabet et al., 2026"), but labels the entries of the
bibliography with the formatting style's label style ("alpha": [GBB26]). This extension
registers a pybtex label style that writes the label the way the citation reads it (one
author: "Efron, 2011"; two: "Boursier and Boyer, 2026"; three or more: "Gabet et al.,
2026"; a letter after the year when two labels would coincide) and a formatting style,
``author_year_labels``, that is pybtex's ``alpha`` with these labels. ``_config.yml``
loads it (``sphinx: local_extensions``) and selects it (``bibtex_default_style``).
"""

from collections import Counter

from pybtex.plugin import register_plugin
from pybtex.style.formatting.alpha import Style as AlphaStyle
from pybtex.style.labels import BaseLabelStyle


def _last_names(entry):
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    return [" ".join(p.last_names).replace("{", "").replace("}", "") for p in persons]


def _author_year(entry):
    names = _last_names(entry)
    if not names:
        who = entry.fields.get("title", entry.key)
    elif len(names) == 1:
        who = names[0]
    elif len(names) == 2:
        who = f"{names[0]} and {names[1]}"
    else:
        who = f"{names[0]} et al."
    return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearLabelStyle(BaseLabelStyle):
    """Labels "Author, year", "A and B, year" or "A et al., year"; "2026a", "2026b" on a clash."""

    def format_labels(self, sorted_entries):
        entries = list(sorted_entries)
        labels = [_author_year(e) for e in entries]
        counts, seen = Counter(labels), Counter()
        for label in labels:
            if counts[label] > 1:
                seen[label] += 1
                yield label + "abcdefghijklmnopqrstuvwxyz"[seen[label] - 1]
            else:
                yield label


class AuthorYearStyle(AlphaStyle):
    """pybtex's alpha style (entries sorted by author, year, title) with author–year labels."""

    default_label_style = "author_year_labels"


register_plugin("pybtex.style.labels", "author_year_labels", AuthorYearLabelStyle)
register_plugin("pybtex.style.formatting", "author_year_labels", AuthorYearStyle)


def setup(app):
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
