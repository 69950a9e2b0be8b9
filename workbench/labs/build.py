"""``make labs``: write the student (and instructor) versions of the labs.

    python -m workbench.labs.build [--src notebooks] [--out labs]

reads every ``lab_*.ipynb`` under ``--src`` and writes ``OUT/student/<lab>`` (solutions
blanked, outputs cleared, checks kept) and ``OUT/instructor/<lab>`` (solutions kept,
outputs cleared). The output is deterministic: the same sources give the same bytes
(sorted JSON keys, no timestamps), so rebuilding changes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

import nbformat

from .student import LabFormatError, instructor_version, student_version

ROOT = pathlib.Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Built:
    lab: str
    student: pathlib.Path
    instructor: pathlib.Path
    blanks: int


def _write(nb, path: pathlib.Path) -> None:
    text = nbformat.writes(nb, version=4)  # sorted keys, one-space indent
    if not text.endswith("\n"):
        text += "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def build(src: pathlib.Path, out: pathlib.Path, pattern: str = "lab_*.ipynb") -> list[Built]:
    labs = sorted(src.glob(pattern))
    if not labs:
        raise FileNotFoundError(f"no {pattern} under {src}")
    built = []
    for path in labs:
        nb = nbformat.read(path, as_version=4)
        student, blanks = student_version(nb, path.name)
        instructor = instructor_version(nb, path.name)
        s, i = out / "student" / path.name, out / "instructor" / path.name
        _write(student, s)
        _write(instructor, i)
        built.append(Built(path.name, s, i, len(blanks)))
    return built


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.labs.build", description=__doc__.split("\n\n")[0])
    p.add_argument("--src", type=pathlib.Path, default=ROOT / "notebooks", help="folder of the instructor labs")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "labs", help="writes OUT/student and OUT/instructor")
    args = p.parse_args(argv)
    try:
        built = build(args.src, args.out)
    except (LabFormatError, FileNotFoundError) as exc:
        print(f"make labs: {exc}", file=sys.stderr)
        return 2
    for b in built:
        print(f"{b.lab}: {b.blanks} blanks -> {b.student}")
    print(f"student versions in {args.out / 'student'}, instructor versions in {args.out / 'instructor'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
