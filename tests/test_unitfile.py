"""``bk.admin.unitfile`` reads a unit as systemd does: repeated keys,
list resets, continued lines, time spans, names or numbers for accounts;
and the installed units read back as what the installer rendered."""

from __future__ import annotations

from pathlib import Path

import pytest

from bk.admin import unitfile, units
from bk.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "x.service"
    path.write_text(text)
    return str(path)


def test_lists_reset_single_keys_take_the_last_and_lines_continue(tmp_path):
    path = write(tmp_path, """# a comment
[Unit]
StartLimitIntervalSec=1min 30s
StartLimitBurst=3
[Service]
; another comment
ExecStartPre=/bin/false
ExecStartPre=
ExecStartPre=-/bin/true one
ExecStart=/bin/sleep \\
    60
User=gpubk
User=1234
Environment=A=1 "B=two words"
Environment='C=3'
RestartSec=500ms
RestartPreventExitStatus=75 77
RestartPreventExitStatus=78
Restart=on-failure
TimeoutStopSec=30s
UMask=0027
RuntimeDirectory=gpubk
RuntimeDirectoryMode=2750
""")
    svc = unitfile.load(path)
    assert svc.exec_start_pre == [["/bin/true", "one"]] and svc.pre_may_fail == [True]
    assert svc.exec_start == ["/bin/sleep", "60"]
    assert svc.user == "1234" and unitfile.uid_of(svc.user, "x") == 1234
    assert svc.environment == {"A": "1", "B": "two words", "C": "3"}
    assert svc.restart_sec == 0.5 and svc.prevent_restart == frozenset({75, 77, 78})
    assert svc.start_limit_interval == 90 and svc.start_limit_burst == 3
    assert svc.timeout_stop == 30 and svc.umask == 0o027
    assert svc.runtime_directory == "gpubk" and svc.runtime_directory_mode == 0o2750


@pytest.mark.parametrize("line", ["ExecStart=+/bin/true", "EnvironmentFile=/etc/x", "RestartSec=soon"])
def test_what_cannot_be_done_without_systemd_is_refused_by_name(tmp_path, line):
    key = line.split("=")[0]
    text = f"[Service]\nUser=gpubk\n{line}\n" + ("" if key == "ExecStart" else "ExecStart=/bin/true\n")
    with pytest.raises(ConfigError) as e:
        unitfile.load(write(tmp_path, text))
    assert key in e.value.message or "prefix" in e.value.message or "time span" in e.value.message


def test_the_shipped_units_read_as_rendered():
    vals = units.values(bk="/opt/gpubk/bin/bk", user="gpubk", group="gpu-users", monitor_user="gpubk",
                        data_dir="/var/lib/gpubk", socket_dir="/run/gpubk", group_access=True)
    for name in units.SYSTEM_UNITS:
        text = units.render((ROOT / "install" / name).read_text(), vals)
        sections = unitfile.parse(text)
        svc = sections["Service"]
        assert svc["User"] == ["gpubk"] and svc["Group"] == ["gpu-users"]
        assert svc["RuntimeDirectoryMode"] == ["2750"]
        assert svc["Type"] == (["notify"] if name == units.BROKER_UNIT else ["simple"])
    assert units.account_name(1234, "gpubk") == "gpubk"
    assert units.account_name(1234, "Bad Name") == "1234" and units.account_name(1234, None) == "1234"
