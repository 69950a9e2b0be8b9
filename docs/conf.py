"""Sphinx configuration of the workbench's documentation and course site (``make docs``).

Sphinx + MyST-NB: the pages are plain Markdown (MyST), the labs are the executed notebooks
(``_ext/course.py``), the API pages come from the docstrings (autodoc) and the magics'
parsers (``_ext/magics_reference.py``). Built with ``-W``: a broken link is an error.
Nothing is fetched from the network when the site is built or viewed (furo ships its assets
and uses system fonts; plotly.js is copied from the plotly package; no widget manager).
"""

from __future__ import annotations

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))  # this tree's workbench package, for autodoc

project = "distrain workbench"
author = "the distrain workbench authors"
copyright = "the distrain workbench authors"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "course",
    "magics_reference",
]

html_theme = "furo"
html_title = "distrain workbench"
html_static_path = ["_static"]
html_favicon = "_static/favicon.png"  # four ranks; also spares browsers a request for /favicon.ico
html_css_files = ["course.css"]
html_show_sourcelink = False
html_copy_source = False

exclude_patterns = ["_build", "_ext", "**/.ipynb_checkpoints", "course/notebooks/student"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# the notebooks come executed (course.py); widgets are drawn from their saved state as static
# plotly figures, so no page loads a widget manager (it would come from a CDN)
nb_execution_mode = "off"
nb_ipywidgets_js = {}
nb_merge_streams = True
nb_code_prompt_show = "Show the answer"  # only the labs' solution cells are folded (course.py)
nb_output_stderr = "show"  # what the ranks wrote to stderr is part of the run

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}
autodoc_mock_imports: list[str] = []

suppress_warnings = [
    # the labs' markdown starts sections at any level a notebook author chose
    "myst.header",
    # IPython syntax in the labs (`%distrain ckpt dir $folder`) that the ipython3 lexer cannot colour
    "misc.highlighting_failure",
]
