"""Tests of cotainr_lumi.stages.pip.hostenv (host pip variables in the container)."""

import logging

from cotainr_lumi.stages.pip.hostenv import host_pip_overrides


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_missing_find_links_entries_are_dropped_and_said_once(tmp_path, caplog):
    (tmp_path / "wheels").mkdir()
    (tmp_path / "loop").symlink_to("loop")
    environ = {"PIP_FIND_LINKS": "/nope ./rel https://x/y /wheels /loop /nope"}
    overrides = host_pip_overrides(root=tmp_path, environ=environ)
    assert overrides == {"PIP_FIND_LINKS": "./rel https://x/y /wheels"}
    warnings = _warnings(caplog)
    assert len(warnings) == 1
    assert "where /nope, /loop does not exist" in warnings[0]


def test_missing_constraint_or_cert_is_a_warning_but_kept(tmp_path, caplog):
    environ = {"PIP_CONSTRAINT": "/host/c.txt", "PIP_CERT": "/host/ca.pem"}
    assert host_pip_overrides(root=tmp_path, environ=environ) == {}
    warnings = _warnings(caplog)
    assert [w.split("=")[0] for w in warnings] == ["PIP_CONSTRAINT", "PIP_CERT"]


def test_nothing_to_say(tmp_path, caplog):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/ca.pem").write_text("x")
    overrides = host_pip_overrides(
        root=tmp_path, environ={"PIP_CERT": "/etc/ca.pem", "PIP_FIND_LINKS": ""}
    )
    assert overrides == {} and _warnings(caplog) == []
