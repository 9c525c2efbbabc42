"""Command blocks marked `<!-- runnable -->` in the docs (tests/docs/runnable.py) run and exit 0,
with the output they promise: each page's blocks in order, in a throw-away copy of the
repository. docs/guides/train-then-prove.md's recipe is run by tests/docs/test_train_then_prove.py
(it trains with SB3 and needs the `rl` extra)."""
from __future__ import annotations

import pytest

from tests.docs import runnable

RECIPE_PAGE = "docs/guides/train-then-prove.md"  # run by test_train_then_prove.py
PAGES = sorted(p for p in runnable.all_blocks() if p != RECIPE_PAGE)


def test_marked_blocks_are_found_where_the_docs_promise_them():
    blocks = runnable.all_blocks()
    for page in ("docs/getting-started.md", "docs/concepts/gaps.md", "docs/concepts/bus-and-safety.md",
                 "docs/guides/manipulator.md", "docs/guides/grid.md", RECIPE_PAGE):
        assert page in blocks, page
    gs = blocks["docs/getting-started.md"][0]
    assert "--lockstep" in gs.script and gs.expect, gs


def test_extract_reads_markers_attributes_and_indented_fences():
    text = ("intro\n\n```sh\nnot marked\n```\n\n<!-- runnable -->\n```sh\necho one\n```\n\n"
            "- a list item:\n\n  <!-- runnable timeout=5 expect=\"two words\" expect=x -->\n  ```bash\n  echo two\n"
            "  echo 'two words' x\n  ```\n")
    b = runnable.extract(text, "p.md")
    assert [x.script for x in b] == ["echo one\n", "echo two\necho 'two words' x\n"]
    assert b[0].expect == [] and b[0].timeout_s == runnable.DEFAULT_TIMEOUT_S
    assert b[1].expect == ["two words", "x"] and b[1].timeout_s == 5.0 and b[1].where == "p.md:15"


@pytest.mark.parametrize("text, why", [
    ("<!-- runnable -->\nplain text\n", "must be followed by"),
    ("<!-- runnable -->\n```python\nprint(1)\n```\n", "must be followed by"),
    ("<!-- runnable colour=red -->\n```sh\ntrue\n```\n", "unknown attribute 'colour=red'"),
    ("<!-- runnable timeout=soon -->\n```sh\ntrue\n```\n", "timeout='soon' is not a number"),
    ("<!-- runnable -->\n```sh\ntrue\n", "not closed"),
])
def test_a_bad_marker_is_an_error_naming_the_place(text, why):
    with pytest.raises(ValueError, match=why) as exc:
        runnable.extract(text, "bad.md")
    assert "bad.md:1" in str(exc.value)


def test_a_failing_or_silent_block_fails_and_stops_the_page(tmp_path):
    blocks = runnable.extract(
        "<!-- runnable expect=\"hello\" -->\n```sh\necho hello > f.txt; cat f.txt\n```\n"
        "<!-- runnable expect=\"absent\" -->\n```sh\necho present\n```\n"
        "<!-- runnable -->\n```sh\ntouch never\n```\n", "t.md")
    res = runnable.run_blocks(blocks, tmp_path)
    assert res[0].problem() is None and (tmp_path / "f.txt").exists()
    assert "lacks ['absent']" in res[1].problem() and len(res) == 2 and not (tmp_path / "never").exists()
    res = runnable.run_blocks(runnable.extract("<!-- runnable -->\n```sh\nfalse\necho after\n```\n", "t.md"), tmp_path)
    assert res[0].problem() == "t.md:2 exited 1" and "after" not in res[0].output  # bash -e
    res = runnable.run_blocks(runnable.extract("<!-- runnable timeout=1 -->\n```sh\nsleep 30\n```\n", "t.md"),
                              tmp_path)
    assert "timed out after 1 s" in res[0].output and res[0].problem()


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.timeout(
    sum(b.timeout_s for b in runnable.all_blocks()[p]) + 120.0)) for p in PAGES])  # each block has its bound
def test_runnable_blocks_of_the_page_pass(page, tmp_path):
    work = runnable.repo_copy(tmp_path / "repo")
    for res in runnable.run_blocks(runnable.all_blocks()[page], work):
        assert res.problem() is None, res.report()
