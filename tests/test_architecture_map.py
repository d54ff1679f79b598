"""docs/dev/architecture.md's "Where to change what" stays true: for each change it names,
the files to open exist, import one another (one connected piece of the import graph:
a file that none of the others imports, and that imports none of them, is not on that
path), and are at most four, but for the one answer the doc itself says is over."""

from __future__ import annotations

import re

import pytest

from testing.imports import PACKAGE, imports_of, module_name
from testing.paths import ROOT

DOC = ROOT / "docs" / "dev" / "architecture.md"
MOST_FILES = 4
QUESTIONS = ("Change how the CPU target is enforced",
             "Add a GPU lever (including one the node agent must permit)",
             "Change the job-wide split (including a new input)",
             "Add a field to the ThrottledJob's status")


def answers(text: str) -> dict[str, tuple[list[str], bool]]:
    """Each question of the section -> (its files, whether it says it is over four)."""
    section = text.split("## Where to change what", 1)[1].split("\n## ", 1)[0]
    out = {}
    for block in section.split("\n### ")[1:]:
        question, _, body = block.partition("\n")
        files = re.findall(r"^- `([^`]+\.py)`", body, re.MULTILINE)
        out[question.strip()] = (files, "Over four" in body)
    return out


def connected(files: list[str]) -> bool:
    """Whether the files are one piece of the import graph (an edge: one imports the
    other, the module or a name in it)."""
    modules = {f: module_name(PACKAGE / f) for f in files}
    imports = {f: imports_of(PACKAGE / f) for f in files}

    def linked(a: str, b: str) -> bool:
        return modules[b] in imports[a] or modules[a] in imports[b]

    reached, todo = {files[0]}, [files[0]]
    while todo:
        here = todo.pop()
        for other in files:
            if other not in reached and linked(here, other):
                reached.add(other)
                todo.append(other)
    return reached == set(files)


def test_the_map_answers_the_four_questions() -> None:
    assert sorted(answers(DOC.read_text())) == sorted(QUESTIONS)


@pytest.mark.parametrize("question", QUESTIONS)
def test_each_answer_is_a_short_path_through_files_that_exist(question: str) -> None:
    files, over = answers(DOC.read_text())[question]
    assert files and all((PACKAGE / f).is_file() for f in files), files
    assert connected(files), f"{question}: not one piece of the import graph: {files}"
    # An answer over four must say so; one that fits must not claim it does not.
    assert (len(files) > MOST_FILES) == over, (question, len(files))


def test_the_check_tells_a_stray_file_from_a_path() -> None:
    assert connected(["operator/quota.py", "operator/cpu_limits.py"])
    assert not connected(["operator/quota.py", "runtime/batching.py"])
    text = ("## Where to change what\n\n### Q\n\n- `a.py`: x\n- `b/c.py`: y\n\n"
            "### R\n\nOver four.\n\n- `d.py`: z\n\n## Next\n")
    assert answers(text) == {"Q": (["a.py", "b/c.py"], False), "R": (["d.py"], True)}
