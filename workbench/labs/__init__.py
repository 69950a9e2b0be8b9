"""Teaching labs: answer checks with specific hints, and the student/instructor build.

``workbench.labs.check("lab_03.my_dim", my_dim, table=t)`` runs the checker registered
under that name (``@workbench.labs.checker``) against the values the student's own run
measured; ``python -m workbench.labs.build`` (``make labs``) writes the student versions.
Notebook side: never imports torch.
"""

from __future__ import annotations

from .checking import CheckFailed, check, checker, registered, verdict

__all__ = ["CheckFailed", "check", "checker", "registered", "verdict"]
