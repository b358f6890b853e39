"""``bk --version [--json]``, kept free of argparse for start-up speed."""

from __future__ import annotations

import sys


def version_data() -> dict:
    import importlib.util

    from bk.buildinfo import build_info

    info = build_info()
    try:
        nvml = importlib.util.find_spec("pynvml") is not None
    except (ImportError, ValueError):
        nvml = False
    return {
        "version": info["version"],
        "build": {"content_sha256": info.get("content_sha256"), "built_at": info.get("built_at"),
                  "source": info.get("source", "archive")},
        "python": ".".join(map(str, sys.version_info[:3])),
        "nvml_importable": nvml,
    }


def print_version(as_json: bool) -> int:
    if as_json:
        from bk.core import jsonfast
        from bk.core.envelope import success

        sys.stdout.write(jsonfast.dumps(success("version", version_data())) + "\n")
    else:
        from bk import __version__

        sys.stdout.write(f"bk {__version__}\n")
    return 0
