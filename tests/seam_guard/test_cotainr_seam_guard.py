"""The seam guard finds what it is to find, and only that (issue 41)."""

import os
from pathlib import Path
import subprocess
import sys
import textwrap

GUARD = Path(__file__).parent

#: cotainr-lumi-like code (its module is below ``cotainr_lumi``) touching
#: cotainr as the old shim and layering did, and as the hook API allows.
PROBE = textwrap.dedent(
    """
    import cotainr
    from cotainr import container, tracing

    settings = tracing.LogSettings(verbosity=1)  # listed; cotainr's own reads
    assert settings.verbosity == 1
    sandbox = container.SingularitySandbox(base_image="some_base_6021")
    assert sandbox.sandbox_dir is None
    assert sandbox.base_image == "some_base_6021"
    assert sandbox._verbosity == 0
    sandbox.sandbox_dir = "elsewhere"
    container.SingularitySandbox.build_image = lambda self, *, path: None
    assert type(cotainr.__version__) is str
    """
)


def _run_probe(tmp_path):
    """Run PROBE as the module ``cotainr_lumi.probe`` under the guard."""
    script = textwrap.dedent(
        f"""
        import cotainr_seam_guard

        cotainr_seam_guard.install()
        probe = {{"__name__": "cotainr_lumi.probe"}}
        exec(compile({PROBE!r}, "probe.py", "exec"), probe)
        print("\\n".join(cotainr_seam_guard.violations()))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(GUARD)}
    env.pop("COTAINR_LUMI_SEAM_GUARD", None)
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
        timeout=60,
    )


def test_the_guard_finds_unlisted_private_and_replaced_names(tmp_path):
    found = _run_probe(tmp_path).stdout.splitlines()
    assert found == [
        "read cotainr.container.SingularitySandbox (probe.py:7)",
        "read cotainr.container.SingularitySandbox.base_image (probe.py:9)",
        "read cotainr.container.SingularitySandbox._verbosity (probe.py:10)",
        "set cotainr.container.SingularitySandbox.sandbox_dir (probe.py:11)",
        "read cotainr.container.SingularitySandbox (probe.py:12)",
        "replaced cotainr.container.SingularitySandbox.build_image",
    ]
