"""Shared by the bench scripts: writing a section of docs/benchmarks.md, and hyperfine's results as
Markdown table rows. The Python scripts import it (bench/ is on their sys.path); the Python that the
shell scripts run inline imports it through bench_python (bench/lib.sh), and the shell scripts splice
with splice_section (bench/lib.sh), which runs:

    python3 bench/lib.py splice DOC TAG SECTION

SECTION (from its begin marker to its end marker) in place of DOC's section TAG, or appended to DOC
after a blank line when DOC has none; DOC "-" prints SECTION and writes nothing.
"""
import json
import sys


def markers(tag):
    """The begin and end markers of the section `tag`: <!-- tag:begin -->, <!-- tag:end -->."""
    return f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"


def block(tag, body):
    """`body` between the markers of `tag`, each on a line of its own."""
    begin, end = markers(tag)
    return f"{begin}\n{body}\n{end}"


def splice(doc, tag, section):
    """Puts `section` (its markers included) in the Markdown file `doc` in place of what lies from the
    begin marker of `tag` to its end marker (included), or, when `doc` has no such section (or does not
    exist yet), appends it after a blank line. `doc` "-": prints `section` only."""
    if doc == "-":
        print(section)
        return
    begin, end = markers(tag)
    try:
        with open(doc) as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    b = text.find(begin)
    e = text.find(end, b) if b >= 0 else -1
    if b >= 0 and e > b:
        text = text[:b] + section + text[e + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    if not text.endswith("\n"):
        text += "\n"
    with open(doc, "w") as f:
        f.write(text)


def hyperfine_results(path):
    """The results of a `hyperfine --export-json` file: one dict per command, times in seconds."""
    with open(path) as f:
        return json.load(f)["results"]


def ms(seconds):
    """A hyperfine time (seconds) as a table cell: "2.34 ms"."""
    return f"{seconds * 1000:.2f} ms"


def hyperfine_rows(results, *columns):
    """One Markdown table row per hyperfine result: "| command | mean | ± σ | median |" in ms, then one
    cell per column, each a function of the result or a list with one value per result."""
    rows = []
    n = min([len(results)] + [len(c) for c in columns if not callable(c)])  # as zip(): the shortest
    for i, r in enumerate(results[:n]):
        cells = [r["command"], ms(r["mean"]), ms(r["stddev"]), ms(r["median"])]
        cells += [str(c(r)) if callable(c) else str(c[i]) for c in columns]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def main(argv):
    if len(argv) == 4 and argv[0] == "splice":
        splice(*argv[1:])
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
