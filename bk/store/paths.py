"""Where bk keeps things (SPEC 2).

Environment variables only choose locations in private mode; in shared mode
every location comes from the trusted configuration file.  XDG variables are
honoured only when absolute, as the XDG Base Directory specification says
("If an implementation encounters a relative path ... it should consider the
path invalid and ignore it").
"""

from __future__ import annotations

import os

from bk.core.record import dataclass

SYSTEM_CONFIG = "/etc/gpubk/config.json"
DEFAULT_SHARED_DATA_DIR = "/var/lib/gpubk"
DEFAULT_SOCKET = "/run/gpubk/broker.sock"
# With BK_DATA_DIR set, the per-user state (presets, prompt history) lives in
# this directory inside it instead of $XDG_STATE_HOME/bk.
STATE_SUBDIR = "state"


def _absolute(value: str | None) -> str | None:
    return value if value and os.path.isabs(value) else None


def home_dir(env: dict) -> str:
    home = _absolute(env.get("HOME"))
    if home:
        return home
    import pwd

    return pwd.getpwuid(os.getuid()).pw_dir


def xdg_dir(env: dict, var: str, fallback: tuple[str, ...]) -> str:
    return _absolute(env.get(var)) or os.path.join(home_dir(env), *fallback)


@dataclass(frozen=True)
class Locations:
    """Where the config came from and where the data lives."""

    mode: str                    # "private" or "shared"
    data_dir: str
    config_file: str | None      # the file that was (or would be) read; None: defaults only
    config_is_system: bool       # True: a trusted file that may hold security keys
    state_dir: str               # per-user private state (presets, job specs)
    cache_dir: str | None = None  # per-user caches that may be deleted at any time (GPU inventory)
    config_dir: str | None = None  # the user's own settings ($XDG_CONFIG_HOME/bk): notification choices


def locate(env: dict | None = None) -> Locations:
    """Decide the mode and the locations from the environment.

    Order: ``BK_DATA_DIR`` forces private mode, with the state directory
    ``$BK_DATA_DIR/state`` (a trial run leaves the real presets and
    notification settings alone); else ``BK_CONFIG_FILE`` or the
    system file ``/etc/gpubk/config.json`` means shared mode (its data dir is
    read from the file later, by the config loader); else private mode under
    ``$XDG_DATA_HOME/bk``.
    """
    env = os.environ if env is None else env
    state = os.path.join(xdg_dir(env, "XDG_STATE_HOME", (".local", "state")), "bk")
    cache = os.path.join(xdg_dir(env, "XDG_CACHE_HOME", (".cache",)), "bk")
    user_dir = os.path.join(xdg_dir(env, "XDG_CONFIG_HOME", (".config",)), "bk")
    user_cfg = os.path.join(user_dir, "config.json")
    data_env = env.get("BK_DATA_DIR")
    cfg_env = env.get("BK_CONFIG_FILE")
    if data_env:
        if not os.path.isabs(data_env):
            from bk.core.errors import ConfigError

            raise ConfigError(f"BK_DATA_DIR must be an absolute path, got {data_env!r}",
                              hint="export BK_DATA_DIR=$(mktemp -d)")
        cfg = cfg_env if cfg_env else user_cfg
        # A trial run (``BK_DATA_DIR=/tmp/gpubk-demo bk ...``) keeps its
        # presets and prompt history beside its data, in STATE_SUBDIR: it
        # must not change the user's real ones, and deleting the directory
        # deletes the whole trial.  This wins over XDG_STATE_HOME.
        trial = os.path.join(data_env, STATE_SUBDIR)
        return Locations("private", data_env, cfg, False, trial, cache, trial)
    if cfg_env:
        return Locations("shared", DEFAULT_SHARED_DATA_DIR, cfg_env, True, state, cache, user_dir)
    if os.path.exists(SYSTEM_CONFIG):
        return Locations("shared", DEFAULT_SHARED_DATA_DIR, SYSTEM_CONFIG, True, state, cache, user_dir)
    data = os.path.join(xdg_dir(env, "XDG_DATA_HOME", (".local", "share")), "bk")
    return Locations("private", data, user_cfg, False, state, cache, user_dir)
