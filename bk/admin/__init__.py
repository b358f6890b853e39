"""Server lifecycle for administrators (run as root).

  init.py  ``bk admin init``: the trusted config and the service directories

Each module computes a plan, applies it, and returns a result object; the
front end (``bk.cli.cmd_admin``) shows the plan, asks, and renders.
"""
