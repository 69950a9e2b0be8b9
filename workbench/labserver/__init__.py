"""The Jupyter server extension behind the workbench's JupyterLab extension (``extensions/``).

Enabled by ``etc/jupyter/jupyter_server_config.d/distrain-workbench.json`` installed with the
package. It lists the rank sets this user's kernels started (from :mod:`workbench.notebook.registry`),
acts on them and streams their events, all without going through the owning kernel.
"""

from __future__ import annotations


def _jupyter_server_extension_points():
    return [{"module": "workbench.labserver"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from .handlers import handlers
    from .monitor import Monitor

    web_app = serverapp.web_app
    web_app.settings["workbench_monitor"] = Monitor(serverapp.root_dir)
    web_app.add_handlers(".*$", handlers(web_app.settings["base_url"]))
    serverapp.log.info("workbench: ranks sidebar handlers at %sworkbench/ranksets", web_app.settings["base_url"])
