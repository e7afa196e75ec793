"""Tests of cotainr_lumi.stages.pip.hostenv (host pip variables in the container)."""

from cotainr_lumi.stages.pip.hostenv import host_pip_variables


def test_missing_find_links_entries_are_dropped_and_said_once(tmp_path):
    (tmp_path / "wheels").mkdir()
    (tmp_path / "loop").symlink_to("loop")
    environ = {"PIP_FIND_LINKS": "/nope ./rel https://x/y /wheels /loop /nope"}
    result = host_pip_variables(root=tmp_path, environ=environ)
    assert result.overrides == {"PIP_FIND_LINKS": "./rel https://x/y /wheels"}
    assert len(result.warnings) == 1
    assert "where /nope, /loop does not exist" in result.warnings[0]


def test_missing_constraint_or_cert_is_a_warning_but_kept(tmp_path):
    environ = {"PIP_CONSTRAINT": "/host/c.txt", "PIP_CERT": "/host/ca.pem"}
    result = host_pip_variables(root=tmp_path, environ=environ)
    assert result.overrides == {}
    assert [w.split("=")[0] for w in result.warnings] == ["PIP_CONSTRAINT", "PIP_CERT"]


def test_nothing_to_say(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/ca.pem").write_text("x")
    result = host_pip_variables(
        root=tmp_path, environ={"PIP_CERT": "/etc/ca.pem", "PIP_FIND_LINKS": ""}
    )
    assert result.overrides == {} and result.warnings == []
